"""JSONL rows from their lines, for every JSONL reader (a file, stdin): the byte-order mark, a line's
parse (or why it is no JSON), and rows numbered from a start index, skipping those a resume has done."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple, Protocol

import orjson

BOM = b"\xef\xbb\xbf"  # UTF-8's byte-order mark, which some tools write at a file's start


class BadLine(NamedTuple):
    error: str


class RowSkip(Protocol):
    """Which rows a resumed run can pass over without decoding them."""

    def row_done(self, index: int) -> bool: ...

    def range_done(self, start: int, stop: int) -> bool: ...


def parse_line(line: bytes) -> Any:
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        return BadLine(f"malformed JSON: {exc}")


def numbered_rows(
    reader: Any, lines: Iterator[bytes], index: int, start: int, stop: int | None, skip: RowSkip | None
) -> Iterator[tuple[int, Any]]:
    """Rows ``start`` up to ``stop`` of ``lines`` (row lines, the first being row ``index``), parsed unless
    ``skip`` has them done; sets the reader's ``end_index`` and ``at_eof`` as it stops."""
    for line in lines:
        if stop is not None and index >= stop:
            reader.end_index = index
            return
        if index >= start and not (skip and skip.row_done(index)):
            row = parse_line(line)
            del line  # not held while the row is prepared: the parsed row is all that lives on
            yield index, row
        index += 1
    reader.end_index, reader.at_eof = index, True
