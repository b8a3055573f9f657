"""The last check before a run's state says complete: the output holds every (row, sample) it owes.

Two counts are compared with what a resume would read back from the output (every whole record up to the
first torn or garbled line): the records the writer thread handed to the writer (the done set), and the
samples each of the run's rows owes (the run's ``n``, or the row's own). A record the writer lost, or a
row the engine never answered, then fails the run (exit 1, one line) instead of a complete state over a
short output: the state stays resumable, and a re-run finds the gap in the output and redoes it.

This reads the output once more, at the end of the run: the same pass a resume makes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from batchgen.app.errors import FatalError
from batchgen.io.checkpoint import DoneSet
from batchgen.io.writers import ParquetWriter, Writer, whole_record


class IncompleteOutput(FatalError):
    """The run reached its end but its output lacks records; it is saved as not complete."""


class Gap(NamedTuple):
    missing: int  # (row, sample) pairs the output lacks
    first: tuple[int, int] | None  # the first of them in row order, when the run's rows say which


class RowSamples:
    """The samples each row owes: the run's ``n``, or a row's own. Only rows that ask for another ``n``
    cost an entry (as in the done set); rows written by this process are marked in a bitmap, since in a
    run with varied ``n`` a row not seen since the resume may have had its own."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.own: dict[int, int] = {}
        self.written = DoneSet(1)

    def wrote(self, index: int, own_n: int | None) -> None:
        if own_n is not None and own_n != self.n:
            self.own[index] = own_n
        self.written.add(index, 0)

    def owed(self, index: int, varied: bool) -> int:
        """Samples row ``index`` must have (with varied ``n``, a row done before the resume: at least one)."""
        if index in self.own:
            return self.own[index]
        return self.n if not varied or self.written.has(index, 0) else 1


def output_keys(writer: Writer) -> Iterator[tuple[int, int]]:
    """(index, sample) of each record a resume would find in the writer's output, in file order."""
    if isinstance(writer, ParquetWriter):
        yield from _parquet_keys(writer.part_files())
    else:  # JSONL, and the OpenAI Batch records file (a JSONL writer too)
        yield from _jsonl_keys(writer.path)


def _jsonl_keys(path: str) -> Iterator[tuple[int, int]]:
    if not os.path.exists(path):
        return
    with open(path, "rb") as f:
        for line in f:
            record = whole_record(line)
            if record is None:
                return  # a resume cuts the output here: nothing after it counts
            yield record["index"], record["sample"]


def _parquet_keys(parts: list[Path]) -> Iterator[tuple[int, int]]:
    import pyarrow.parquet as pq

    for part in parts:
        table = pq.read_table(part, columns=["index", "sample"])
        yield from zip(table.column("index").to_pylist(), table.column("sample").to_pylist(), strict=True)


def find_gap(
    keys: Iterator[tuple[int, int]], done: DoneSet, owed: RowSamples, rows: range | None, varied: bool,
    dropped: DoneSet | None = None,
) -> Gap:  # fmt: skip
    """What the output (``keys``) lacks: records in ``done`` it does not hold, and samples ``rows`` owe
    that nothing wrote. ``dropped``: rows --on-error skip wrote nothing for (they owe nothing)."""
    found, held = DoneSet(done.n), 0
    for index, sample in keys:
        if found.add(index, sample):
            held += done.has(index, sample)
    missing, first = done.count - held, None
    none_dropped = dropped is None or not dropped.count
    if rows is None or (not varied and none_dropped and found.range_done(rows.start, rows.stop)):
        return Gap(missing, first)
    for index in rows:
        if dropped is not None and dropped.has(index, 0):
            continue
        gaps = found.missing(index, owed.owed(index, varied))
        if gaps:
            first = first or (index, gaps[0])
            missing += sum(1 for s in gaps if not done.has(index, s))  # the others are counted above
    return Gap(missing, first)


def check_complete(writer: Writer, done: DoneSet, owed: RowSamples, rows: range | None, varied: bool,
                   dropped: DoneSet | None, advice: str) -> None:  # fmt: skip
    """Raise ``IncompleteOutput`` (one line) when the output lacks any record the run owes."""
    gap = find_gap(output_keys(writer), done, owed, rows, varied, dropped)
    if not gap.missing:
        return
    first = "" if gap.first is None else f" (the first: row {gap.first[0]}, sample {gap.first[1]})"
    raise IncompleteOutput(
        f"the output {writer.path} lacks {gap.missing} record{'s' * (gap.missing != 1)} of this run{first}; "
        f"it is not marked complete: {advice}"
    )
