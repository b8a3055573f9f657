import gzip
import io
from itertools import islice

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchgen.io.checkpoint import DoneSet
from batchgen.io.readers import InputError, open_input
from batchgen.io.row_lines import BadLine
from batchgen.io.stdin_reader import KEPT_ROWS, StdinReader


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
    assert reader.count_rows() == 4  # rows: blank lines are not counted
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


# -- plain JSONL by byte ranges ----------------------------------------------------------------------------
AWKWARD = (  # blank and whitespace-only lines, CRLF, an indented row, no final newline
    b'\n{"id": 0}\n\n{"id": 1}\r\n  \r\n \t{"id": 2}\n{"id": 3, "pad": "xxxxxxxxxxxxxxxxxxxx"}\n\t\n'
    b'{"id": 4}\r\n\r\n{"id": 5}\n{"id": 6}'
)


@pytest.mark.parametrize("count", range(1, 10))
def test_byte_splits_tile_the_rows_with_global_indices(tmp_path, count):
    path = tmp_path / "x.jsonl"
    path.write_bytes(AWKWARD)
    whole = list(open_input(str(path)).iter_rows())
    assert [r["id"] for _, r in whole] == list(range(7))
    got, expected_start = [], 0
    for i in range(count):
        reader = open_input(str(path))  # each shard on its own, as in an array task
        start, stop = reader.split_bytes(i, count)
        assert start == expected_start and stop >= start
        rows = list(reader.iter_rows(start, stop if i < count - 1 else None))
        assert [i for i, _ in rows] == list(range(start, stop))
        assert reader.end_index == stop and reader.at_eof == (i == count - 1)
        got += rows
        expected_start = stop
    assert got == whole and expected_start == 7


def test_seek_to_a_row_and_count_at_most(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_bytes(AWKWARD)
    reader = open_input(str(path))
    assert reader.count_rows(at_most=4) == 4 and reader.count_rows(at_most=50) == 7
    assert [r["id"] for _, r in reader.iter_rows(5)] == [5, 6]
    assert list(open_input(str(path)).iter_rows(9)) == [] and reader.count_rows() == 7
    gz = _write_jsonl(tmp_path / "x.jsonl.gz", _rows(5), gzip.open)
    assert open_input(gz).split_bytes(0, 2) is None and open_input(gz).count_rows(True, at_most=3) == 3


class _CountingFile(io.FileIO):
    def __init__(self, path, counter: list[int]) -> None:
        super().__init__(path)
        self.counter = counter

    def readinto(self, buffer):
        n = super().readinto(buffer)
        self.counter[0] += n or 0
        return n


def test_the_last_shard_of_a_large_file_reads_about_its_own_part(tmp_path, monkeypatch):
    path = tmp_path / "big.jsonl"
    _write_jsonl(path, [{"id": i, "prompt": "word " * (i % 50)} for i in range(40_000)])
    size, count, read = path.stat().st_size, 8, [0]
    reader = open_input(str(path))
    monkeypatch.setattr(reader, "_open", lambda: io.BufferedReader(_CountingFile(str(path), read)))
    start, stop = reader.split_bytes(count - 1, count)
    counted = read[0]  # newlines counted (never parsed): the bytes before the part, and the part
    assert reader.count_rows() == stop == 40_000  # known from the split: the progress total costs nothing
    assert read[0] == counted and size <= counted <= size + (1 << 17)
    rows = list(reader.iter_rows(start))
    parsed = read[0] - counted
    assert [i for i, _ in rows] == list(range(start, 40_000)) and rows[0][1]["id"] == start
    assert size // count - 1000 <= parsed <= size // count + (1 << 16)  # its part, give or take a buffer


# -- a UTF-8 byte-order mark, and stdin ------------------------------------------------------------------
BOM = b"\xef\xbb\xbf"


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".jsonl.zst"])
def test_a_byte_order_mark_is_skipped_and_offsets_stay_right(tmp_path, suffix):
    data = BOM + b"".join(orjson.dumps(r) + b"\n" for r in _rows(6))
    path = tmp_path / f"bom{suffix}"
    if suffix.endswith(".gz"):
        data = gzip.compress(data)
    elif suffix.endswith(".zst"):
        data = pytest.importorskip("zstandard").ZstdCompressor().compress(data)
    path.write_bytes(data)
    reader = open_input(str(path))
    assert list(reader.iter_rows()) == list(enumerate(_rows(6)))
    assert list(reader.iter_rows(2, 4)) == [(2, _rows(6)[2]), (3, _rows(6)[3])]
    assert reader.count_rows(exact=True) == 6


def test_byte_splits_of_a_file_with_a_byte_order_mark_tile_its_rows(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(BOM + b"".join(orjson.dumps(r) + b"\n" for r in _rows(9)))
    got = []
    for i in range(3):
        reader = open_input(str(path))
        start, stop = reader.split_bytes(i, 3)
        got += list(reader.iter_rows(start, stop))
    assert got == list(enumerate(_rows(9)))


class _Stream(io.RawIOBase):
    """A pipe of ``rows`` lines made on demand, counting the bytes handed out."""

    def __init__(self, rows: int, head: bytes = b"") -> None:
        self.lines = (orjson.dumps({"id": i, "prompt": "x" * 100}) + b"\n" for i in range(rows))
        self.pending, self.sent = head, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while len(self.pending) < len(buffer):
            line = next(self.lines, None)
            if line is None:
                break
            self.pending += line
        n = min(len(buffer), len(self.pending))
        buffer[:n], self.pending = self.pending[:n], self.pending[n:]
        self.sent += n
        return n


def test_stdin_is_read_as_a_stream_and_its_head_twice():
    raw = _Stream(20_000, head=BOM)
    reader = StdinReader(io.BufferedReader(raw))
    head = list(islice(reader.iter_rows(), 100))  # the checks before the model loads
    assert [r["id"] for _, r in head] == list(range(100)) and raw.sent < 100_000  # not the whole pipe
    rows = reader.iter_rows(stop=15_000)
    assert [(i, r["id"]) for i, r in islice(rows, 1000)] == [(i, i) for i in range(1000)]  # head replayed
    assert raw.sent < 200_000  # a row at a time: memory does not grow with the pipe
    assert sum(1 for _ in rows) == 14_000 and reader.end_index == 15_000 and not reader.at_eof
    assert len(reader._kept) == KEPT_ROWS
    with pytest.raises(RuntimeError, match="cannot be read again"):
        next(reader.iter_rows())


def test_stdin_rows_blank_lines_and_malformed_ones():
    reader = StdinReader(io.BytesIO(BOM + b'{"prompt": "a"}\n\n{oops\n{"prompt": "b"}'))
    rows = list(reader.iter_rows())
    assert [i for i, _ in rows] == [0, 1, 2] and rows[2][1] == {"prompt": "b"}
    assert rows[0][1] == {"prompt": "a"} and isinstance(rows[1][1], BadLine)
    assert reader.at_eof and reader.end_index == 3 and reader.count_rows() is None
    assert isinstance(open_input("-"), StdinReader)
