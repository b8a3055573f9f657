"""Row arithmetic over the bytes of a plain JSONL file, without parsing a line.

A row is a line that is not blank (``line.strip()`` non-empty: blank lines are not rows), so the row
number of a byte offset is the count of non-blank lines before it. That count is vectorised with numpy
over 16 MiB chunks cut at line starts (no Python loop per line, so it runs near memory speed), which
is what lets a shard start in the middle of a file with its rows' global indices intact.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import BinaryIO

import numpy as np

CHUNK = 1 << 24
_STEPS = 8  # leading whitespace bytes stepped over vectorised
_NL = 10
_WS = np.zeros(256, dtype=bool)
_WS[list(b" \t\n\r\x0b\x0c")] = True  # what bytes.strip() removes


def row_starts(a: np.ndarray) -> np.ndarray:
    """Offsets, in ``a``, of the non-blank lines of ``a`` (whole lines; the last may lack its newline)."""
    if a.size == 0:
        return np.zeros(0, dtype=np.int64)
    nl = np.flatnonzero(a == _NL)
    ends = nl if a[-1] == _NL else np.append(nl, a.size)
    starts = np.concatenate(([0], nl + 1))[: ends.size]
    # A line is blank only if its first byte is whitespace (an empty line's "first byte" is its newline);
    # only those few candidates are looked at further.
    blank = _WS[a[np.minimum(starts, a.size - 1)]]
    maybe = np.flatnonzero(blank & (ends - starts > 1))  # one whitespace byte alone is surely blank
    if maybe.size:
        blank[maybe] = ~_any_text(a, starts[maybe], ends[maybe])
    return starts[~blank]


def _any_text(a: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """For each [start, end) of ``a`` (its first byte whitespace): does it hold a non-whitespace byte?
    Stepped over the leading whitespace of all lines at once (indented lines need a few steps); lines
    with a long run of it are settled over their whole span."""
    text = np.zeros(starts.size, dtype=bool)
    live, pos = np.arange(starts.size), starts + 1
    for _ in range(_STEPS):
        live = live[pos[live] < ends[live]]
        if live.size == 0:
            return text
        ws = _WS[a[pos[live]]]
        text[live[~ws]] = True
        live = live[ws]
        pos[live] += 1
    spans = [a[p:e] for p, e in zip(pos[live].tolist(), ends[live].tolist(), strict=True)]
    text[live] = [not _WS[s].all() for s in spans]
    return text


def iter_chunks(f: BinaryIO, start: int, end: int | None = None) -> Iterator[tuple[int, np.ndarray]]:
    """(offset, bytes as uint8) of [start, end) in pieces of whole lines (``start`` is a line start);
    each piece ends after a newline, except the last one of the range."""
    pos = f.seek(start)
    size = CHUNK
    while end is None or pos < end:
        want = size if end is None else min(size, end - pos)
        data = f.read(want)
        if not data:
            return
        cut = data.rfind(b"\n") + 1
        at_end = len(data) < want or (end is not None and pos + len(data) >= end)
        if at_end or cut == len(data):
            cut = len(data)
        elif cut == 0:  # one line longer than the chunk: read it whole
            size *= 2
            f.seek(pos)
            continue
        yield pos, np.frombuffer(data, dtype=np.uint8, count=cut)
        pos += cut
        size = CHUNK
        if cut < len(data):
            f.seek(pos)


def count_rows(f: BinaryIO, start: int, end: int | None = None) -> int:
    """Rows (non-blank lines) starting in [start, end); ``start`` and ``end`` are line starts."""
    return sum(row_starts(a).size for _, a in iter_chunks(f, start, end))


def find_row(f: BinaryIO, k: int, start: int) -> tuple[int, int]:
    """The offset of the k-th row (0-based) from line start ``start``, or (end of file, rows there)
    when fewer than k + 1 rows follow."""
    seen = 0
    for pos, a in iter_chunks(f, start):
        rows = row_starts(a)
        if seen + rows.size > k:
            return pos + int(rows[k - seen]), k
        seen += rows.size
    return f.seek(0, os.SEEK_END), seen


def line_start_at_or_after(f: BinaryIO, pos: int) -> int:
    """The first line start >= ``pos`` (the file's size when no line starts there)."""
    if pos <= 0:
        return 0
    f.seek(pos - 1)
    offset = pos - 1
    while block := f.read(1 << 16):
        hit = block.find(b"\n")
        if hit >= 0:
            return offset + hit + 1
        offset += len(block)
    return offset
