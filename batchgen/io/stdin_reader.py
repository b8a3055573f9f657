"""INPUT ``-``: JSONL read from stdin as a stream, one line at a time (memory does not grow with its size).

A stream is read once, but a run reads its input's head twice: the checks before the model loads look at
the first rows, then generation reads from the start. So the lines read first are kept, up to
``KEPT_ROWS``, and a later read replays them before reading on. Stdin has no size, no byte offsets and no
second reading: no row count, no sharding, no resume (``app/stdin_input.py`` refuses those up front).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any, BinaryIO

from batchgen.io.input_digest import InputDigest, digested_lines
from batchgen.io.row_lines import BOM, RowSkip, numbered_rows

STDIN = "-"
KEPT_ROWS = 128  # at least what a run's checks read before the model loads (app/run.py)


class StdinReader:
    path = STDIN

    def __init__(self, stream: BinaryIO | None = None) -> None:
        self._stream = stream  # None: sys.stdin's bytes, looked up when first read (tests swap sys.stdin)
        self._kept: list[bytes] = []  # the first rows' lines, for a later read to replay
        self._read_past_kept = False  # a read went beyond them: those lines are gone
        self._at_start = True  # no line read yet: a byte-order mark may open the next one
        self.end_index, self.at_eof = 0, False

    def count_rows(self, exact: bool = False, at_most: int | None = None) -> None:
        return None  # unknown until read to its end

    def split_bytes(self, index: int, count: int) -> None:
        return None

    def schema_columns(self) -> None:
        return None  # JSONL has no schema: the first rows are checked instead

    def fingerprint(self) -> dict[str, Any]:
        return {"format": "jsonl", "stream": "stdin"}

    def iter_rows(
        self,
        start: int = 0,
        stop: int | None = None,
        skip: RowSkip | None = None,
        columns: list[str] | None = None,
        digest: InputDigest | None = None,
    ) -> Iterator[tuple[int, Any]]:
        self.end_index, self.at_eof = 0, False
        source = self._lines() if digest is None else digested_lines(self._lines(), digest, 0, start, stop)
        yield from numbered_rows(self, source, 0, start, stop, skip)

    def _lines(self) -> Iterator[bytes]:
        """The rows' lines (blank lines are not rows): the kept ones again, then the stream's next."""
        if self._read_past_kept:
            raise RuntimeError("stdin was already read past its first rows: it cannot be read again")
        yield from list(self._kept)
        stream = self._stream if self._stream is not None else sys.stdin.buffer
        for line in stream:
            if self._at_start:
                line, self._at_start = line.removeprefix(BOM), False
            if not line.strip():
                continue
            if len(self._kept) < KEPT_ROWS:
                self._kept.append(line)
            else:
                self._read_past_kept = True
            yield line
