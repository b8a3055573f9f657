"""Streaming input readers: JSONL (plain, .gz, .zst) and Parquet (a file, a directory or a glob).

Readers yield ``(index, row)`` one at a time, so memory stays flat whatever the input's size. ``row`` is a
dict, or a ``BadLine`` for a line that is not JSON. ``iter_rows(start, stop)`` starts at a row offset and
stops at a row count (Parquet skips whole row groups through the footer metadata; plain JSONL seeks to
the row's byte offset, found by counting newlines), which is what sharding builds on; ``split_bytes``
splits plain JSONL into byte ranges at line starts; ``skip`` lets a resumed run pass over finished rows
without decoding them.
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import io
import os
from collections.abc import Iterator
from itertools import filterfalse, islice
from pathlib import Path
from typing import Any, Protocol

from batchgen.io import lines
from batchgen.io.input_digest import InputDigest, digested_lines
from batchgen.io.row_lines import BOM, RowSkip, numbered_rows

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".jsonl.gz", ".ndjson.gz", ".jsonl.zst", ".ndjson.zst")
PARQUET_SUFFIX = ".parquet"
_HEAD_BYTES = 1 << 20  # fingerprint() hashes this much of the head (compared for states before input.digest)
_COUNT_LIMIT = 4 << 30  # count the rows of plain JSONL for progress up to this size (seconds of scanning)
_BATCH_ROWS = 1024


class InputError(ValueError):
    """The INPUT argument is unusable (missing, unknown format): a usage error."""


class Reader(Protocol):
    """``end_index`` and ``at_eof`` describe the last ``iter_rows`` that ran to its end: the global index
    after the last row it passed (skipped ones included), and whether that was the input's end."""

    path: str
    end_index: int
    at_eof: bool

    def count_rows(self, exact: bool = False, at_most: int | None = None) -> int | None: ...

    def split_bytes(self, index: int, count: int) -> tuple[int, int] | None: ...

    def schema_columns(self) -> list[str] | None: ...

    def fingerprint(self) -> dict[str, Any]: ...

    def iter_rows(
        self,
        start: int = 0,
        stop: int | None = None,
        skip: RowSkip | None = None,
        columns: list[str] | None = None,
        digest: InputDigest | None = None,
    ) -> Iterator[tuple[int, Any]]: ...


def open_input(path: str) -> Reader:
    """A reader for ``path`` (``-``: stdin, as JSONL); raises InputError naming what is wrong."""
    if path == "-":
        from batchgen.io.stdin_reader import StdinReader  # it builds on this module

        return StdinReader()
    if any(ch in path for ch in "*?[") and not os.path.exists(path):
        files = sorted(glob.glob(path))
        if not files:
            raise InputError(f"no files match {path!r}")
        return _parquet_files(path, files)
    if not os.path.exists(path):
        raise InputError(f"input {path!r} does not exist")
    if os.path.isdir(path):
        files = sorted(str(p) for p in Path(path).rglob(f"*{PARQUET_SUFFIX}") if p.is_file())
        if not files:
            raise InputError(f"directory {path!r} holds no .parquet files")
        return ParquetReader(path, files)
    lower = path.lower()
    if lower.endswith(PARQUET_SUFFIX):
        return ParquetReader(path, [path])
    if lower.endswith(JSONL_SUFFIXES):
        return JsonlReader(path)
    raise InputError(
        f"unknown input format {path!r}: expected .jsonl (.gz, .zst), .parquet, "
        "or a directory or glob of .parquet files"
    )


def _parquet_files(pattern: str, files: list[str]) -> Reader:
    bad = [f for f in files if not f.lower().endswith(PARQUET_SUFFIX)]
    if bad:
        raise InputError(f"a glob input must match only .parquet files; {bad[0]!r} is not one")
    return ParquetReader(pattern, files)


def _head_hash(paths: list[str]) -> str:
    digest = hashlib.sha256()
    for p in paths[:1]:
        with open(p, "rb") as f:
            digest.update(f.read(_HEAD_BYTES))
    return digest.hexdigest()[:16]


# -- JSONL -----------------------------------------------------------------------------------------------
class JsonlReader:
    """Plain files are read from a byte offset: ``_anchors`` maps a line start to the rows before it (0
    at 0, then each offset a count or a split found), so a row's offset is counted from the nearest one
    (see batchgen/io/lines.py). Compressed files are read from their start, line by line."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.compression = "gzip" if path.endswith(".gz") else "zstd" if path.endswith(".zst") else None
        self.end_index, self.at_eof = 0, False
        self._anchors: dict[int, int] = {0: 0}
        self._rows: int | None = None  # all rows, once counted

    def _open(self) -> io.BufferedIOBase:
        if self.compression == "gzip":
            return gzip.open(self.path, "rb")
        if self.compression == "zstd":
            try:
                import zstandard
            except ImportError:  # an optional dependency
                raise InputError(
                    "reading .zst input needs the zstandard package: pip install zstandard"
                ) from None
            raw = open(self.path, "rb")  # noqa: SIM115 - closed with the wrapper
            return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, closefd=True))
        return open(self.path, "rb")

    def count_rows(self, exact: bool = False, at_most: int | None = None) -> int | None:
        """Rows, or ``at_most`` when there are at least that many. Plain files: counted from the last
        known offset when cheap (up to a few GiB, or ``exact``). Compressed: None unless ``exact``, then
        one streaming pass."""
        if self.compression:
            if not exact:
                return None
            with self._open() as f:
                rows = (1 for line in f if line.strip())
                return sum(islice(rows, at_most) if at_most is not None else rows)
        if at_most is not None:
            return at_most if self._locate(at_most) is not None else self._rows
        if self._rows is None:
            offset = max(self._anchors)
            if not exact and os.path.getsize(self.path) - offset > _COUNT_LIMIT:
                return None
            with self._open() as f:
                self._rows = self._anchors[offset] + lines.count_rows(f, offset)
        return self._rows

    def split_bytes(self, index: int, count: int) -> tuple[int, int] | None:
        """(first row, row after the last) of the rows whose lines start in byte range ``index`` of
        ``count`` equal ones: read from the bytes before it, newlines counted, never parsed. None for
        a compressed file."""
        if self.compression:
            return None
        size = os.path.getsize(self.path)
        with self._open() as f:
            begin = lines.line_start_at_or_after(f, index * size // count)
            end = lines.line_start_at_or_after(f, (index + 1) * size // count) if index < count - 1 else size
            start = self._rows_before(f, begin)
            stop = start + lines.count_rows(f, begin, end)
        if end == size:
            self._rows = stop
        self._anchors[begin] = start
        return start, stop

    def _rows_before(self, f: io.BufferedIOBase, offset: int) -> int:
        base = max(a for a in self._anchors if a <= offset)
        return self._anchors[base] + lines.count_rows(f, base, offset)

    def _locate(self, row: int) -> int | None:
        """A line start with ``row`` rows before it; None when the file has no row ``row``."""
        base = max((a for a, r in self._anchors.items() if r <= row), key=self._anchors.__getitem__)
        if self._anchors[base] == row:
            return base
        with self._open() as f:
            offset, found = lines.find_row(f, row - self._anchors[base], base)
        if self._anchors[base] + found < row:
            self._rows = self._anchors[base] + found
            return None
        self._anchors[offset] = row
        return offset

    def schema_columns(self) -> list[str] | None:
        return None  # JSONL has no schema: the first rows are checked instead

    def fingerprint(self) -> dict[str, Any]:
        return {"format": "jsonl", "size": os.path.getsize(self.path), "head": _head_hash([self.path])}

    def iter_rows(
        self,
        start: int = 0,
        stop: int | None = None,
        skip: RowSkip | None = None,
        columns: list[str] | None = None,
        digest: InputDigest | None = None,
    ) -> Iterator[tuple[int, Any]]:
        self.end_index, self.at_eof = 0, False
        index, offset = (0, 0) if self.compression else (start, self._locate(start))
        if offset is None:  # the file ends before row ``start``
            self.end_index, self.at_eof = self._rows, True
            return
        with self._open() as f:
            if offset:
                f.seek(offset)
            source = _row_lines(f, offset)
            if digest is not None:  # the part already consumed, checked as it streams
                source = digested_lines(source, digest, index, start, stop)
            yield from numbered_rows(self, source, index, start, stop, skip)


def _row_lines(f: io.BufferedIOBase, offset: int) -> Iterator[bytes]:
    """The lines of rows from ``offset`` on: blank lines are not rows; a UTF-8 byte-order mark opening the
    file is not part of its first row. No variable here holds a line once it is handed on: a huge line's
    bytes go as soon as its row is parsed."""
    rows = filterfalse(bytes.isspace, f)  # isspace, unlike strip, copies no line
    if offset == 0:
        yield from map(_without_bom, islice(rows, 1))
    yield from rows


def _without_bom(line: bytes) -> bytes:
    return line.removeprefix(BOM)


# -- Parquet ---------------------------------------------------------------------------------------------
class ParquetReader:
    def __init__(self, path: str, files: list[str]) -> None:
        self.path = path
        self.files = files
        self._meta: list[Any] | None = None
        self.end_index, self.at_eof = 0, False

    def _metadata(self) -> list[Any]:
        import pyarrow.parquet as pq

        if self._meta is None:
            try:
                self._meta = [pq.read_metadata(f) for f in self.files]
            except Exception as exc:  # pyarrow raises several types for a non-Parquet file
                raise InputError(f"cannot read Parquet input {self.path!r}: {exc}") from None
        return self._meta

    def count_rows(self, exact: bool = False, at_most: int | None = None) -> int:
        rows = sum(m.num_rows for m in self._metadata())
        return rows if at_most is None else min(rows, at_most)

    def split_bytes(self, index: int, count: int) -> None:
        return None  # row groups, found through the footers, are what a Parquet shard skips

    def schema_columns(self) -> list[str]:
        return list(self._metadata()[0].schema.to_arrow_schema().names)

    def fingerprint(self) -> dict[str, Any]:
        sizes = [os.path.getsize(f) for f in self.files]
        names = [
            os.path.relpath(f, self.path) if os.path.isdir(self.path) else Path(f).name for f in self.files
        ]
        return {"format": "parquet", "files": names, "size": sum(sizes), "head": _head_hash(self.files)}

    def iter_rows(
        self,
        start: int = 0,
        stop: int | None = None,
        skip: RowSkip | None = None,
        columns: list[str] | None = None,
        digest: InputDigest | None = None,
    ) -> Iterator[tuple[int, Any]]:
        import pyarrow.parquet as pq

        total = self.count_rows()
        self.end_index = min(total, stop) if stop is not None else total
        self.at_eof = stop is None or stop >= total
        offset = 0  # global index of the current row group's first row
        for path, meta in zip(self.files, self._metadata(), strict=True):
            if stop is not None and offset >= stop:
                return
            with pq.ParquetFile(path) as pf:
                names = pf.schema_arrow.names
                cols = [c for c in columns if c in names] if columns is not None else None
                for group in range(meta.num_row_groups):
                    n = meta.row_group(group).num_rows
                    lo, hi = max(start, offset), min(offset + n, stop if stop is not None else offset + n)
                    if lo < hi and digest is not None:  # read, not decoded, when its rows are done
                        digest.check_group(path, group, meta.row_group(group), cols, offset)
                    if lo < hi and not (skip and skip.range_done(lo, hi)):
                        yield from _group_rows(pf, group, cols, offset, lo, hi, skip)
                    offset += n
                    if stop is not None and offset >= stop:
                        return
        if digest is not None:
            digest.check_end(offset)


def _group_rows(pf, group: int, cols, offset: int, lo: int, hi: int, skip: RowSkip | None):
    """Rows lo..hi (global indices) of one row group, a batch at a time."""
    index = offset
    for batch in pf.iter_batches(batch_size=_BATCH_ROWS, row_groups=[group], columns=cols):
        first, end = index, index + batch.num_rows
        index = end
        if end <= lo:
            continue
        if first >= hi:
            return
        a, b = max(lo, first), min(hi, end)
        if skip and skip.range_done(a, b):
            continue
        for i, row in enumerate(batch.slice(a - first, b - a).to_pylist(), start=a):
            if not (skip and skip.row_done(i)):
                yield i, row
