import errno
import shutil

import orjson
import pyarrow.parquet as pq
import pytest

from batchgen.io.checkpoint import RunState, load_state, save_state, sidecar_dir, state_path
from batchgen.io.durable import naming
from batchgen.io.faults import Faults
from batchgen.io.records import dumps_line, make_record
from batchgen.io.writers import (
    OutputError,
    has_records,
    open_output,
    output_format,
    records_to_table,
    remove_output,
)


def _rec(i, sample=0, **extra):
    return make_record(
        row_id=f"r{i}",
        index=i,
        sample=sample,
        completion=f"c{i}",
        finish_reason="length",
        prompt_tokens=3,
        completion_tokens=2,
        kept=extra or None,
    )


def test_record_field_order_and_optional_fields():
    rec = make_record(
        row_id=1, index=1, sample=0, completion="", finish_reason="error", prompt_tokens=0,
        completion_tokens=0, error="bad", kept={"k": 1}, token_ids=[1], logprobs=[-0.5],
    )  # fmt: skip
    assert list(rec) == [
        "id", "index", "sample", "completion", "finish_reason", "prompt_tokens", "completion_tokens",
        "error", "k", "token_ids", "logprobs",
    ]  # fmt: skip
    assert "error" not in _rec(0)


def test_output_format():
    assert output_format("a.JSONL") == "jsonl" and output_format("x/b.parquet") == "parquet"
    with pytest.raises(OutputError):
        output_format("out.csv")


def test_jsonl_write_flush_recover(tmp_path):
    path = str(tmp_path / "o.jsonl")
    w = open_output(path)
    for i in range(3):
        w.write(_rec(i))
    w.flush()
    w.close()
    assert [r["index"] for r in open_output(path).recover()] == [0, 1, 2]


def test_jsonl_flush_point_counts_only_flushes_with_new_records(tmp_path):
    """``flush:k`` (the resume tests' "during flush" kill) always leaves un-fsynced records behind."""
    path = tmp_path / "o.jsonl"
    faults = Faults("flush:3")  # never reached by the writer here: a third visit would kill pytest
    w = open_output(str(path), faults)
    w.flush()  # nothing written yet: not a visit
    w.write(_rec(0))
    assert w.synced_bytes == 0
    w.flush()  # visit 1
    w.flush()  # nothing new since the last fsync: not a visit
    assert [faults.due("flush"), faults.due("flush")] == [False, True]  # visits 2 and 3
    assert w.synced_bytes == path.stat().st_size > 0
    w.close()


@pytest.mark.parametrize("tail", [b'{"id":"r3","index":3,"sam', b"\x00\x00\x00\x00", b'{"index": 9}'])
def test_jsonl_recover_cuts_a_torn_tail(tmp_path, tail):
    path = tmp_path / "o.jsonl"
    good = b"".join(dumps_line(_rec(i)) for i in range(2))
    path.write_bytes(good + tail)
    w = open_output(str(path))
    assert [r["index"] for r in w.recover()] == [0, 1]
    assert path.read_bytes() == good and w.dropped_bytes == len(tail)
    w.write(_rec(5))  # appends after the cut: no glued lines
    w.flush()
    w.close()
    assert [orjson.loads(x)["index"] for x in path.read_bytes().splitlines()] == [0, 1, 5]


def test_jsonl_recover_stops_at_garbage_in_the_middle(tmp_path):
    path = tmp_path / "o.jsonl"
    path.write_bytes(dumps_line(_rec(0)) + b"garbage\n" + dumps_line(_rec(1)))
    assert [r["index"] for r in open_output(str(path)).recover()] == [0]
    assert path.read_bytes() == dumps_line(_rec(0))


def test_parquet_parts_then_one_file(tmp_path):
    path = str(tmp_path / "o.parquet")
    w = open_output(path)
    list(w.recover())
    w.write(_rec(0, k=1))
    w.flush()
    w.write(_rec(1, k="text"))  # a kept column whose type differs between parts
    w.write(_rec(2))
    w.flush()
    assert not (tmp_path / "o.parquet").exists() and has_records(path)
    parts = sorted(p.name for p in (sidecar_dir(path) / "parts").iterdir())
    assert parts == ["part-000000.parquet", "part-000001.parquet"]
    w2 = open_output(path)  # a resumed writer sees both parts
    assert [r["index"] for r in w2.recover()] == [0, 1, 2]
    w2.write(_rec(3))
    w2.finish()
    rows = pq.read_table(path).to_pylist()
    assert [r["index"] for r in rows] == [0, 1, 2, 3]
    assert [r["k"] for r in rows] == ["1", "text", None, None]
    assert not (sidecar_dir(path) / "parts").exists()


def test_parquet_recover_ignores_unfinished_part(tmp_path):
    path = str(tmp_path / "o.parquet")
    w = open_output(path)
    list(w.recover())
    w.write(_rec(0))
    w.flush()
    (sidecar_dir(path) / "parts" / "part-000001.parquet.tmp").write_bytes(b"PAR1 torn")
    w2 = open_output(path)
    assert [r["index"] for r in w2.recover()] == [0]
    assert not list((sidecar_dir(path) / "parts").glob("*.tmp"))


def test_parquet_final_file_with_stale_parts_wins(tmp_path):
    """A crash after finish() renamed the final file in, before it removed the parts."""
    path = str(tmp_path / "o.parquet")
    w = open_output(path)
    list(w.recover())
    w.write(_rec(0))
    w.write(_rec(1))
    w.flush()
    pq.write_table(records_to_table([_rec(0), _rec(1)]), path)
    w2 = open_output(path)
    assert sorted(r["index"] for r in w2.recover()) == [0, 1]  # once each, not twice
    w2.write(_rec(2))
    w2.finish()
    assert [r["index"] for r in pq.read_table(path).to_pylist()] == [0, 1, 2]


def test_remove_output_keeps_the_lock(tmp_path):
    path = str(tmp_path / "o.jsonl")
    (tmp_path / "o.jsonl").write_text("x\n")
    side = sidecar_dir(path)
    (side / "parts").mkdir(parents=True)
    (side / "lock").write_text("")
    (side / "state.json").write_text("{}")
    remove_output(path)
    assert not has_records(path) and [p.name for p in side.iterdir()] == ["lock"]


# -- a disk that fills up (BATCHGEN_FAULT=nospace:N and friends) -------------------------------------------
DISK_FAULTS = [("nospace", errno.ENOSPC), ("quota", errno.EDQUOT), ("eio", errno.EIO)]


@pytest.mark.parametrize(("fault", "code"), DISK_FAULTS)
def test_jsonl_writer_on_a_failing_disk_keeps_what_was_flushed(tmp_path, fault, code):
    path = str(tmp_path / "o.jsonl")
    first = b"".join(dumps_line(_rec(i)) for i in range(3))
    w = open_output(path, Faults(f"{fault}:{len(first) + 10}"))
    for i in range(3):
        w.write(_rec(i))
    w.flush()
    for i in range(3, 6):
        w.write(_rec(i))
    with pytest.raises(OSError) as failed:
        w.flush()
    assert failed.value.errno == code and failed.value.filename == path
    w.close()  # drops the rest: nothing is retried, nothing raises
    assert (tmp_path / "o.jsonl").read_bytes() == first + dumps_line(_rec(3))[:10]  # a short write, torn
    again = open_output(path)
    assert [r["index"] for r in again.recover()] == [0, 1, 2] and again.dropped_bytes == 10


def test_parquet_writer_on_a_full_disk_leaves_no_partial_files(tmp_path):
    path = str(tmp_path / "o.parquet")
    disk = Faults("nospace:1000000")
    w = open_output(path, disk)
    list(w.recover())
    w.write(_rec(0))
    w.flush()
    disk.disk_left = 100  # the disk fills up: the next part is cut short
    w.write(_rec(1))
    with pytest.raises(OSError, match="No space left") as failed:
        w.flush()
    assert failed.value.filename.endswith("part-000001.parquet.tmp") and not list(tmp_path.rglob("*.tmp"))
    w2 = open_output(path, disk)  # the final join fails: the durable parts are kept
    assert [r["index"] for r in w2.recover()] == [0]
    with pytest.raises(OSError, match="No space left"):
        w2.finish()
    assert not (tmp_path / "o.parquet").exists() and not (tmp_path / "o.parquet.tmp").exists()
    assert [r["index"] for r in open_output(path).recover()] == [0]


def test_a_failed_state_write_keeps_the_old_state(tmp_path):
    out = tmp_path / "o.jsonl"
    sidecar_dir(out).mkdir()
    save_state(out, RunState({"model": "m"}, records=3))
    full = Faults("nospace:0")
    with pytest.raises(OSError, match="No space left") as failed:
        save_state(out, RunState({"model": "m"}, records=9), full.open_small)
    assert failed.value.filename == str(state_path(out)) + ".tmp"
    assert load_state(out).records == 3 and [p.name for p in sidecar_dir(out).iterdir()] == ["state.json"]
    shutil.rmtree(sidecar_dir(out))  # a vanished directory: the error names the file it could not create
    with pytest.raises(FileNotFoundError, match="state.json.tmp"):
        save_state(out, RunState({"model": "m"}))


def test_naming_keeps_the_error_and_adds_the_path():
    with pytest.raises(FileNotFoundError) as named, naming("/x/out.jsonl"):
        raise OSError(errno.ENOENT, "gone")
    assert named.value.filename == "/x/out.jsonl" and named.value.errno == errno.ENOENT
    with pytest.raises(OSError) as kept, naming("/x/out.jsonl"):
        raise OSError(errno.EIO, "bad", "/other")
    assert kept.value.filename == "/other"
