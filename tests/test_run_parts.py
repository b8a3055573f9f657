"""Unit tests of the run's parts that need no model: signals, progress, status, fault injection."""

import signal

import pytest

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


def test_faults_fire_once_at_the_kth_visit():
    faults = Faults("flush:3")
    assert [faults.due("flush") for _ in range(4)] == [False, False, True, False]
    assert not Faults().due("flush") and not Faults("part:1").due("flush")
