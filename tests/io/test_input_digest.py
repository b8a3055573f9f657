"""The consumed part's digest (batchgen/io/input_digest.py), on the readers alone: no model, no run."""

import gzip
import os

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchgen.io.checkpoint import DoneSet
from batchgen.io.input_digest import TAG_BYTES, InputChanged, InputDigest
from batchgen.io.readers import open_input


def _rows(n):
    return [{"id": f"r{i}", "prompt": f"p{i}", "extra": i} for i in range(n)]


def _jsonl(path, rows, last_break=True):
    data = b"\n".join(orjson.dumps(r) for r in rows) + (b"\n" if last_break else b"")
    path.write_bytes(data)
    return str(path)


def _read(path, digest, start=0, stop=None, skip=None, columns=None):
    return [i for i, _ in open_input(str(path)).iter_rows(start, stop, skip, columns, digest)]


def _done(indices):
    done = DoneSet(1)
    for i in indices:
        done.add(i, 0)
    return done


def test_tags_are_recorded_then_each_row_is_checked_before_it_goes_on(tmp_path):
    inp, tags = tmp_path / "in.jsonl", tmp_path / "input.digest"
    _jsonl(inp, _rows(10))
    digest = InputDigest(tags, fresh=True)
    assert _read(inp, digest, stop=6) == list(range(6))
    digest.close()
    assert os.path.getsize(tags) == 6 * TAG_BYTES
    rows = _rows(10)
    rows[4]["prompt"] = "P4"
    _jsonl(inp, rows)
    got = []
    with pytest.raises(InputChanged, match="changed at row 4"):
        for i, _ in open_input(str(inp)).iter_rows(0, None, _done([0, 1, 3]), None, InputDigest(tags, False)):
            got.append(i)
    assert got == [2]  # a row left undone before the change is handed on, once it is checked


def test_new_rows_after_the_recorded_ones_get_tags_and_a_torn_tag_is_dropped(tmp_path):
    inp, tags = tmp_path / "in.jsonl", tmp_path / "input.digest"
    _jsonl(inp, _rows(4), last_break=False)  # a last line without its break, then the file grows
    digest = InputDigest(tags, fresh=True)
    _read(inp, digest)
    digest.close()
    with open(tags, "ab") as f:
        f.write(b"\x01\x02\x03")  # a kill in the middle of a tag's write
    _jsonl(inp, _rows(7))
    digest = InputDigest(tags, fresh=False)
    assert digest.recorded == 4 and os.path.getsize(tags) == 4 * TAG_BYTES
    assert _read(inp, digest, skip=_done(range(4))) == [4, 5, 6]
    digest.close()
    assert os.path.getsize(tags) == 7 * TAG_BYTES


def test_an_input_shorter_than_the_consumed_part_is_refused(tmp_path):
    inp, tags = tmp_path / "in.jsonl", tmp_path / "input.digest"
    _jsonl(inp, _rows(8))
    digest = InputDigest(tags, fresh=True)
    _read(inp, digest)
    digest.close()
    _jsonl(inp, _rows(5))
    with pytest.raises(InputChanged, match="ends at row 5 now"):
        _read(inp, InputDigest(tags, fresh=False), skip=_done(range(8)))
    assert _read(inp, InputDigest(tags, fresh=False), stop=3) == [0, 1, 2]  # a run that reads less


def test_a_shard_checks_its_rows_from_its_own_first_row(tmp_path):
    inp, tags = tmp_path / "in.jsonl.gz", tmp_path / "input.digest"
    inp.write_bytes(gzip.compress(b"".join(orjson.dumps(r) + b"\n" for r in _rows(10))))
    digest = InputDigest(tags, fresh=True)
    assert _read(inp, digest, start=5, stop=8) == [5, 6, 7]
    digest.close()
    assert os.path.getsize(tags) == 3 * TAG_BYTES
    rows = _rows(10)
    rows[2]["prompt"] = rows[9]["prompt"] = "other"  # another shard's rows
    inp.write_bytes(gzip.compress(b"".join(orjson.dumps(r) + b"\n" for r in rows)))
    assert _read(inp, InputDigest(tags, fresh=False), start=5, stop=8, skip=_done([5, 6, 7])) == []


def test_parquet_row_groups_are_checked_in_the_columns_the_run_reads(tmp_path):
    inp, tags = tmp_path / "in.parquet", tmp_path / "input.digest"
    rows = _rows(12)
    pq.write_table(pa.Table.from_pylist(rows), inp, row_group_size=4)
    digest = InputDigest(tags, fresh=True)
    assert _read(inp, digest, stop=8, columns=["id", "prompt"]) == list(range(8))
    digest.close()
    assert os.path.getsize(tags) == 2 * TAG_BYTES
    rows[5]["extra"] = -1  # a column the run does not read
    pq.write_table(pa.Table.from_pylist(rows), inp, row_group_size=4)
    done = _done(range(8))
    assert _read(inp, InputDigest(tags, fresh=False), skip=done, columns=["id", "prompt"]) == [8, 9, 10, 11]
    rows[6]["prompt"] = "P6"
    pq.write_table(pa.Table.from_pylist(rows), inp, row_group_size=4)
    with pytest.raises(InputChanged, match=r"row group 1 of in.parquet \(rows 4 to 7\)"):
        _read(inp, InputDigest(tags, fresh=False), skip=done, columns=["id", "prompt"])
