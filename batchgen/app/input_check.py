"""A run's input, checked against the part its output already consumed (``io/input_digest.py``).

The fingerprint names the input by its format only: its content is checked unit by unit as it streams,
so an input that grew goes on with its new rows, while a change in the part already read (any byte,
whatever the file's size) is refused with the first changed row. States written before the digest
existed name the input by its size and a hash of its first MiB instead: a re-run onto such an output
compares those, as then (``comparable``), and records the digest from there on.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import chain
from typing import Any

from batchgen.app.errors import FatalError
from batchgen.app.options import RunOptions
from batchgen.io.checkpoint import DoneSet, RunState
from batchgen.io.input_digest import InputChanged, InputDigest, digest_path
from batchgen.io.readers import Reader
from batchgen.io.stdin_reader import STDIN

_CONTENT_KEYS = ("size", "head", "files")  # of Reader.fingerprint(): what the digest checks instead


def input_identity(reader: Reader) -> dict[str, Any]:
    """The input's part of the fingerprint: what kind of input it is, not what it holds."""
    return {k: v for k, v in reader.fingerprint().items() if k not in _CONTENT_KEYS}


def comparable(new: dict[str, Any], old: dict[str, Any], reader: Reader) -> dict[str, Any]:
    """``new``, as it compares with ``old``: with the input's size and head hash when ``old`` was written
    before the digest and names its input by them."""
    if not any(k in old.get("input", {}) for k in _CONTENT_KEYS):
        return new
    return {**new, "input": reader.fingerprint()}


def generation_rows(
    reader: Reader, opts: RunOptions, done: DoneSet, varied_n: bool, fresh: bool
) -> Iterator[tuple[int, Any]]:
    """The rows this run generates, a resume passing over its done ones (reading them all again when rows
    asked for their own ``n``) and checking the consumed part on the way. Started here, before the model
    loads and anything is written: when the rows left all follow that part, as after a finished run
    with a smaller --limit, the whole check is over, and a changed row is refused with the output as it
    was. Rows left inside the part (the in-flight rows of an interrupted run) are checked as generation
    goes on, each before it is generated. ``fresh``: the output has no records (its digest starts over).
    """
    digest = None
    if reader.path != STDIN:  # stdin is read once: it never resumes
        digest = InputDigest(digest_path(opts.output), fresh, sync_every=opts.flush_every)
    skip = done if done.count and not varied_n else None
    rows = checked(reader.iter_rows(opts.row_start, opts.row_stop, skip, _columns(reader, opts), digest),
                   digest, opts)  # fmt: skip
    first = next(rows, None)
    return rows if first is None else chain([first], rows)


def finished_covers(reader: Reader, opts: RunOptions, old: RunState) -> bool:
    """Whether the finished run ``old`` covers this re-run, once the part it consumed is found unchanged
    (else a FatalError naming the first changed row). One that read its input to the end no longer
    does when rows were appended since: the re-run goes on with them."""
    if reader.path == STDIN or (digest := InputDigest.recorded_only(digest_path(opts.output))) is None:
        return True  # written before the digest existed: its fingerprint compared the input
    end = None if old.total_rows is None else opts.row_start + old.total_rows
    grew = end is not None and old.exhausted and (opts.limit is None or opts.limit > old.total_rows)
    stop = end + 1 if grew else end if end is not None else opts.row_stop  # + 1: is there a row after?
    rows = reader.iter_rows(opts.row_start, stop, _DoneBelow(end if grew else None), _columns(reader, opts),
                            digest)  # fmt: skip
    rest = checked(rows, digest, opts)
    try:
        return next(rest, None) is None
    finally:
        rest.close()


def checked(
    rows: Iterator[tuple[int, Any]], digest: InputDigest | None, opts: RunOptions
) -> Iterator[tuple[int, Any]]:
    """``rows`` with each one's tag in the digest's file before the row goes on (so before it can have a
    record); a changed input as the FatalError that refuses the run."""
    try:
        for row in rows:
            if digest is not None:
                digest.write_out()
            yield row
    except InputChanged as exc:
        raise FatalError(
            f"input {opts.input} {exc}, inside the part already read for {opts.output}: "
            "restore it to resume, --overwrite to start afresh, or another OUTPUT"
        ) from None
    finally:
        if digest is not None:
            digest.close()


def _columns(reader: Reader, opts: RunOptions) -> list[str] | None:
    """The Parquet columns the run reads (and whose bytes its digest covers); None for JSONL."""
    columns = reader.schema_columns()
    return opts.spec.needed_columns(columns) if columns is not None else None


class _DoneBelow:
    """A skip for a finished run's check: every row done (``end`` None), or every row before ``end``."""

    def __init__(self, end: int | None) -> None:
        self.end = end

    def row_done(self, index: int) -> bool:
        return self.end is None or index < self.end

    def range_done(self, start: int, stop: int) -> bool:
        return self.end is None or stop <= self.end
