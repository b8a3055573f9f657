import gzip

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchgen.io.checkpoint import DoneSet
from batchgen.io.readers import BadLine, InputError, open_input


def _rows(n, start=0):
    return [{"id": f"r{i}", "prompt": f"p{i}", "extra": i} for i in range(start, start + n)]


def _write_jsonl(path, rows, opener=open):
    with opener(path, "wb") as f:
        for r in rows:
            f.write(orjson.dumps(r) + b"\n")
    return str(path)


def _write_parquet(path, rows, row_group_size=4):
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_size)
    return str(path)


@pytest.fixture(params=["plain", "gz", "zst"])
def jsonl_path(request, tmp_path):
    rows = _rows(10)
    if request.param == "plain":
        return _write_jsonl(tmp_path / "in.jsonl", rows)
    if request.param == "gz":
        return _write_jsonl(tmp_path / "in.jsonl.gz", rows, gzip.open)
    zstd = pytest.importorskip("zstandard")
    data = b"".join(orjson.dumps(r) + b"\n" for r in rows)
    path = tmp_path / "in.jsonl.zst"
    path.write_bytes(zstd.ZstdCompressor().compress(data))
    return str(path)


def test_jsonl_reads_all_formats_with_offsets(jsonl_path):
    reader = open_input(jsonl_path)
    assert [i for i, _ in reader.iter_rows()] == list(range(10))
    assert reader.end_index == 10 and reader.at_eof
    got = list(reader.iter_rows(start=3, stop=6))
    assert got == [(i, _rows(10)[i]) for i in range(3, 6)]
    assert reader.end_index == 6 and not reader.at_eof


def test_jsonl_count_is_cheap_only_when_plain(jsonl_path):
    count = open_input(jsonl_path).count_rows()
    assert count == (10 if jsonl_path.endswith(".jsonl") else None)


def test_jsonl_blank_lines_malformed_lines_and_skip(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"prompt": "a"}\n\n{oops\n[1, 2]\n{"prompt": "b"}')  # no final newline
    reader = open_input(str(path))
    rows = list(reader.iter_rows())
    assert [i for i, _ in rows] == [0, 1, 2, 3]
    assert isinstance(rows[1][1], BadLine) and "malformed JSON" in rows[1][1].error
    assert rows[2][1] == [1, 2] and rows[3][1] == {"prompt": "b"}
    assert reader.count_rows() == 5  # counts lines, blank ones too: an estimate for the progress bar
    done = DoneSet(1)
    done.add(0, 0)
    done.add(2, 0)
    assert [i for i, _ in reader.iter_rows(skip=done)] == [1, 3]


def test_parquet_row_groups_offsets_and_projection(tmp_path):
    path = _write_parquet(tmp_path / "in.parquet", _rows(10), row_group_size=3)
    reader = open_input(path)
    assert reader.count_rows() == 10
    assert reader.schema_columns() == ["id", "prompt", "extra"]
    got = list(reader.iter_rows(start=2, stop=8, columns=["prompt", "id"]))
    assert [i for i, _ in got] == list(range(2, 8))
    assert got[0][1] == {"id": "r2", "prompt": "p2"}  # projected: "extra" never decoded
    assert reader.end_index == 8 and not reader.at_eof


def test_parquet_skips_done_row_groups(tmp_path):
    path = _write_parquet(tmp_path / "in.parquet", _rows(9), row_group_size=3)
    done = DoneSet(1)
    for i in (0, 1, 2, 4):
        done.add(i, 0)
    assert [i for i, _ in open_input(path).iter_rows(skip=done)] == [3, 5, 6, 7, 8]


def test_parquet_directory_and_glob_continue_the_index(tmp_path):
    d = tmp_path / "ds"
    d.mkdir()
    _write_parquet(d / "part-0.parquet", _rows(4))
    _write_parquet(d / "part-1.parquet", _rows(3, start=4))
    for source in (str(d), str(d / "*.parquet")):
        reader = open_input(source)
        assert reader.count_rows() == 7
        rows = list(reader.iter_rows(start=2, stop=6))
        assert [(i, r["id"]) for i, r in rows] == [(i, f"r{i}") for i in range(2, 6)]


def test_fingerprint_follows_content_not_path(tmp_path):
    a = _write_jsonl(tmp_path / "a.jsonl", _rows(5))
    b = _write_jsonl(tmp_path / "b.jsonl", _rows(5))
    c = _write_jsonl(tmp_path / "c.jsonl", _rows(6))
    assert open_input(a).fingerprint() == open_input(b).fingerprint()
    assert open_input(a).fingerprint() != open_input(c).fingerprint()


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("missing.jsonl", "does not exist"),
        ("x.csv", "unknown input format"),
        ("nomatch-*.parquet", "no files"),
    ],
)
def test_unusable_inputs(tmp_path, name, needle):
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(InputError, match=needle):
        open_input(str(tmp_path / name))


def test_directory_without_parquet(tmp_path):
    with pytest.raises(InputError, match="no .parquet"):
        open_input(str(tmp_path))
