"""Unit tests of the run's parts that need no model: signals, progress, status, fault injection."""

import errno
import os
import signal

import pytest

from batchgen.app.error_kinds import MAX_KINDS, ErrorKinds
from batchgen.app.errors import storage_failure
from batchgen.app.progress import Counters, Progress, summary_text
from batchgen.app.shards import shard_pattern
from batchgen.app.signals import Interrupt, SignalControl
from batchgen.app.status import status_data, status_text
from batchgen.io.checkpoint import RunState, save_state, sidecar_dir
from batchgen.io.faults import Faults


def test_first_signal_drains_second_sigint_abandons():
    with SignalControl(drain_timeout=60) as sig:
        signal.raise_signal(signal.SIGTERM)
        assert sig.draining.is_set() and not sig.abandon and sig.signal_name == "SIGTERM"
        signal.raise_signal(signal.SIGTERM)  # a second SIGTERM changes nothing
        assert not sig.abandon
        sig.interruptible = True  # inside the engine: abandoning unwinds at once
        with pytest.raises(Interrupt):
            signal.raise_signal(signal.SIGINT)
        assert sig.abandon
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers restored


def test_abandon_outside_the_engine_only_sets_a_flag():
    with SignalControl(drain_timeout=60) as sig:
        signal.raise_signal(signal.SIGUSR1)
        signal.raise_signal(signal.SIGINT)
        assert sig.abandon


def test_signal_while_loading_stops_at_once():
    with SignalControl(drain_timeout=60) as sig:
        sig.loading = True
        with pytest.raises(Interrupt):
            signal.raise_signal(signal.SIGUSR1)


def test_progress_counts_rows_tokens_and_eta():
    progress = Progress(Counters(rows_done=2, records=2), total_rows=10, log_every=30, bar=False)
    progress.record("length", 5, 7, row_done=True)
    progress.record("error", 3, 0, row_done=False)
    assert progress.total.rows_done == 3 and progress.run.records == 2 and progress.total.errors == 1
    assert progress.line().startswith("3/10 rows (30.0%), 1 errors, 7 tokens out")
    assert "ETA" in progress.line()
    summary = progress.summary("complete")
    assert summary["finish_reasons"] == {"length": 1, "error": 1} and summary["completion_tokens"] == 7
    assert summary_text(summary).startswith("complete: 1 rows, 2 records, 1 errors (output now 3/10 rows)")


def test_progress_eta_comes_from_tokens_not_rows():
    resumed = Counters(rows_done=2, records=2, completion_tokens=100)  # two long rows already written
    progress = Progress(resumed, total_rows=10, log_every=30, bar=False)
    progress.record("length", 5, 10, row_done=True)
    progress.record("stop", 5, 10, row_done=True)
    progress.stop_clock()
    progress.end = progress.start + 10.0  # 20 tokens in 10 s
    # 6 rows left x 30 tokens a finished row (120 / 4) = 180 tokens at 2 tok/s (by rows it would be 30 s)
    assert progress.eta_s() == pytest.approx(90.0)
    assert progress.line() == "4/10 rows (40.0%), 0 errors, 20 tokens out, 2.0 tok/s, ETA 0:01:30"
    assert progress.summary("complete")["tokens_per_s"] == 2.0


def test_progress_bar_counts_rows_and_tokens(capsys):
    progress = Progress(Counters(), total_rows=4, log_every=30, bar=True)
    progress.record("length", 5, 7, row_done=True)
    progress.close()
    bar = capsys.readouterr().err.strip().split("\r")[-1]
    assert "1/4 rows" in bar and "7 tokens out" in bar and "tok/s" in bar and "0 err" in bar


def test_a_failed_row_counts_once_by_its_commonest_error():
    progress = Progress(Counters(), total_rows=4, log_every=30, bar=False)
    for index, error in [
        (0, "prompt too long: 90 tokens"),
        (1, "prompt too long: 95 tokens"),
        (2, "no prompt"),
    ]:
        progress.record("error", 3, 0, row_done=False)
        progress.failed(index, error)
    progress.failed(0, "prompt too long: 90 tokens")  # another sample of row 0: the row counted once
    progress.skipped(3, "no prompt")
    kinds = progress.total.error_kinds
    assert progress.total.failed_rows == 4 and progress.total.skipped == 1
    assert kinds.commonest() == ("prompt too long: 90 tokens", 2)
    assert kinds.as_counts() == {"prompt too long: 90 tokens": 2, "no prompt": 2}


def test_error_kinds_keep_a_bounded_number_of_kinds():
    many = ErrorKinds({f"column {chr(65 + i % 26)}{chr(65 + i // 26)}": 1 for i in range(MAX_KINDS + 5)})
    assert len(many.as_counts()) == MAX_KINDS and sum(many.as_counts().values()) == MAX_KINDS


def test_progress_counts_back_to_the_last_flush():
    progress = Progress(Counters(rows_done=2, records=2), total_rows=10, log_every=30, bar=False)
    progress.record("length", 5, 7, row_done=True)
    progress.mark_durable()
    progress.record("stop", 4, 3, row_done=True)
    progress.revert_to_durable()  # a write failed: only what the output durably holds counts
    assert (progress.total.records, progress.total.rows_done, progress.run.records) == (3, 3, 1)
    assert progress.run.finish_reasons == {"length": 1} and progress.run.completion_tokens == 7


def test_shard_patterns():
    assert shard_pattern("/d/out.jsonl") == "/d/out.shard-[0-9]*-of-[0-9]*.jsonl"
    assert shard_pattern("/d/out-{shard}.parquet") == "/d/out-*.parquet"


def test_status_of_one_run(tmp_path):
    out = tmp_path / "o.jsonl"
    sidecar_dir(out).mkdir()
    save_state(out, RunState({}, total_rows=8, rows_done=2, records=2, errors=1, finish_reasons={"stop": 1}))
    data = status_data(str(out))
    assert data["totals"]["rows_done"] == 2 and not data["totals"]["complete"]
    text = status_text(data)
    assert "interrupted" in text and "2/8 rows (25.0%)" in text and "1 errors" in text


def test_status_names_the_commonest_error_and_the_rate(tmp_path):
    out = tmp_path / "o.jsonl"
    sidecar_dir(out).mkdir()
    errors = {"prompt too long: 90 tokens": 2, "no prompt": 1}
    save_state(out, RunState({}, rows_done=3, records=3, errors=3, failed_rows=3, error_counts=errors,
                             rate_tok_s=12.34, complete=True))  # fmt: skip
    text = status_text(status_data(str(out)))
    assert "\n  failed     3 rows; commonest error (2 rows): prompt too long: 90 tokens\n" in text
    assert "\n  rate       12.3 tok/s out in the last run, saved " in text
    assert status_data(str(out))["totals"]["failed_rows"] == 3


def test_faults_fire_once_at_the_kth_visit():
    faults = Faults("flush:3")
    assert [faults.due("flush") for _ in range(4)] == [False, False, True, False]
    assert not Faults().due("flush") and not Faults("part:1").due("flush")


def test_a_filling_disk_takes_its_room_then_fails(tmp_path):
    disk = Faults("nospace:5")
    with disk.open(tmp_path / "a", "wb", buffering=0) as f:
        assert f.write(b"abc") == 3 and f.write(b"defg") == 2  # a short write, as a real disk does
        with pytest.raises(OSError, match="No space left"):
            f.write(b"h")
    with pytest.raises(OSError, match="No space left"), disk.open_small(tmp_path / "b") as f:
        f.write(b"{}")  # a small file takes no room, but fails once the disk is full
    assert (tmp_path / "a").read_bytes() == b"abcde"
    room = Faults("quota:5")
    with room.open_small(tmp_path / "c") as f:
        f.write(b"x" * 100)
    assert room.disk_left == 5 and (tmp_path / "c").stat().st_size == 100
    assert Faults().open(tmp_path / "d").__class__.__name__ == "BufferedWriter"  # unarmed: the builtin


@pytest.mark.parametrize(
    ("code", "needle"),
    [
        (errno.ENOSPC, "No space left on device (ENOSPC); free some space, then re-run the same command"),
        (errno.EDQUOT, "(EDQUOT); free some space, then re-run"),
        (errno.EIO, "Input/output error (EIO); re-run the same command to resume"),
        (errno.ENOENT, "No such file or directory (ENOENT); re-run"),
        (errno.EISDIR, "Is a directory (EISDIR); a re-run meets it again: fix the path or its permissions"),
        (errno.EROFS, "(EROFS); a re-run meets it again"),
        (errno.EACCES, "Permission denied (EACCES); a re-run meets it again"),
    ],
)
def test_storage_failures_read_as_one_line_naming_the_file(code, needle):
    message = str(storage_failure(OSError(code, os.strerror(code), "/data/out.jsonl")))
    assert message.startswith("I/O error on /data/out.jsonl: ") and needle in message and "\n" not in message
    assert ("re-run the same command" in message) == (code not in (errno.EISDIR, errno.EROFS, errno.EACCES))
