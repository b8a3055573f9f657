"""What a resume checks its input against: a short tag of each unit of input the output has consumed.

A unit is a JSONL row (its line; a last line without its break counts as having one) or a Parquet row
group (the bytes of the column chunks the run reads). Its tag, 8 bytes of SHA-256, is appended to
``OUTPUT.batchgen/input.digest`` as the run reads it, in input order from the run's first row: the file
is the consumed part's fingerprint. A resume streams the input from the same first row anyway (to pass
over the rows already done) and compares the tag of each unit it meets with the recorded one, in order:
the first that differs is the first changed row, and the check costs a hash per unit, never a second
read. Units past the recorded ones are new (an input that grew) and get their tags.

A unit's tag reaches the file (``write_out``) before the row is handed on to be generated, so a killed
run never leaves a record whose row has no tag; the file is synced every ``sync_every`` seconds and when
the rows end. (After a power loss, the tags of the last seconds may be gone while records of the same
seconds, written but not yet synced, survive: those rows are then taken as the input has them now.)
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from hashlib import sha256  # with the CPU's SHA instructions where it has them: faster than BLAKE2b
from pathlib import Path
from typing import Any

from batchgen.io.checkpoint import sidecar_dir
from batchgen.io.durable import naming

TAG_BYTES = 8
DIGEST_NAME = "input.digest"  # in OUTPUT.batchgen/
_READ_TAGS = 8192  # recorded tags read at a time while comparing
_PIECE = 1 << 20  # a Parquet column chunk is hashed this much at a time (memory stays flat)


class InputChanged(ValueError):
    """The input differs, in the part already consumed, from what the output's records came from; the
    message says where (``changed at row 18``, ``ends at row 12 now``)."""


class InputDigest:
    """The tags of one output's consumed units: compared while a run re-reads them, appended after them.
    Used by one thread at a time: the one reading the input."""

    def __init__(self, path: Path, fresh: bool, record: bool = True, sync_every: float = 10.0) -> None:
        """``fresh``: forget earlier tags (a run with no records yet). ``record``: append new units' tags
        (a check of a finished run appends none)."""
        self.path, self.record, self.sync_every = path, record, sync_every
        if record:
            path.parent.mkdir(parents=True, exist_ok=True)
        with naming(path):
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT if record else os.O_RDONLY, 0o644)
            size = os.fstat(self._fd).st_size
            self.recorded = 0 if fresh else size // TAG_BYTES  # a torn last tag (a kill mid-write) is none
            self._end = self.recorded * TAG_BYTES  # where the next new tag goes
            if record and size != self._end:
                os.ftruncate(self._fd, self._end)
        self.units = 0  # units this run has met
        self._block, self._block_start = b"", 0
        self._pending = bytearray()  # new units' tags not yet in the file
        self._synced_at = time.monotonic()

    @classmethod
    def recorded_only(cls, path: Path) -> InputDigest | None:
        """The digest of a finished run, to compare against (None when the output has none)."""
        return cls(path, fresh=False, record=False) if path.exists() else None

    # -- units -----------------------------------------------------------------------------------------
    def check_line(self, index: int, line: bytes) -> None:
        """Row ``index`` of JSONL, its line as read (never copied: it may be huge)."""
        tag = sha256(line)
        if not line.endswith(b"\n"):
            tag.update(b"\n")  # the last line may lack its break: the same row once the file grows
        if not self._same(tag.digest()[:TAG_BYTES]):
            raise InputChanged(f"changed at row {index}")

    def check_group(
        self, path: str, number: int, group: Any, columns: list[str] | None, first_row: int
    ) -> None:
        """Row group ``number`` of Parquet file ``path`` (``group``: its metadata; ``first_row``: the global
        index of its first row)."""
        if not self._same(group_tag(path, group, columns)):
            rows = f"rows {first_row} to {first_row + group.num_rows - 1}"
            raise InputChanged(f"changed at row group {number} of {Path(path).name} ({rows})")

    def check_end(self, rows: int) -> None:
        """The input ended after ``rows`` rows: it must still hold every unit already consumed."""
        if self.units < self.recorded:
            raise InputChanged(f"ends at row {rows} now")

    def _same(self, tag: bytes) -> bool:
        """Account the next unit; False when a tag was recorded for it and differs."""
        k = self.units
        self.units = k + 1
        if k < self.recorded:
            return tag == self._recorded_tag(k)
        if self.record:
            self._pending += tag
        return True

    def _recorded_tag(self, k: int) -> bytes:
        i = (k - self._block_start) * TAG_BYTES
        if not 0 <= i < len(self._block):
            self._block_start, i = k, 0
            with naming(self.path):
                self._block = os.pread(self._fd, _READ_TAGS * TAG_BYTES, k * TAG_BYTES)
        return self._block[i : i + TAG_BYTES]

    # -- durability ------------------------------------------------------------------------------------
    def write_out(self) -> None:
        """Hand the new units' tags to the file (before their rows go on); sync when one is due."""
        if not self._pending:
            return
        data, self._pending = bytes(self._pending), bytearray()
        with naming(self.path):
            view = memoryview(data)
            while view:  # a short write is retried with the rest
                done = os.pwrite(self._fd, view, self._end)
                self._end += done
                view = view[done:]
            if time.monotonic() - self._synced_at >= self.sync_every:
                self._sync()

    def close(self) -> None:
        """Write out and sync what is left; later calls do nothing."""
        if self._fd < 0:
            return
        try:
            self.write_out()
            if self.record:
                with naming(self.path):
                    self._sync()
        finally:
            os.close(self._fd)
            self._fd = -1

    def _sync(self) -> None:
        os.fsync(self._fd)
        self._synced_at = time.monotonic()


def digest_path(output: str) -> Path:
    return sidecar_dir(output) / DIGEST_NAME


def digested_lines(
    lines: Iterator[bytes], digest: InputDigest, index: int, start: int, stop: int | None
) -> Iterator[bytes]:
    """``lines`` (row lines, the first being row ``index``) with rows ``start`` up to ``stop`` checked
    against ``digest`` before they go on; at the input's end, that it still holds the consumed part."""
    check = _LineCheck(digest, index, start, stop)
    yield from map(check, lines)  # no variable here holds a line once it is handed on
    digest.check_end(check.index)


class _LineCheck:
    def __init__(self, digest: InputDigest, index: int, start: int, stop: int | None) -> None:
        self.digest, self.index, self.start, self.stop = digest, index, start, stop

    def __call__(self, line: bytes) -> bytes:
        index = self.index
        self.index = index + 1
        if index >= self.start and (self.stop is None or index < self.stop):
            self.digest.check_line(index, line)
        return line


def group_tag(path: str, group: Any, columns: list[str] | None) -> bytes:
    """The tag of a Parquet row group: its row count and the raw bytes of its column chunks (those of
    ``columns``, the top-level columns the run reads; None: all), read straight from the file, not
    decoded."""
    tag = sha256(group.num_rows.to_bytes(8, "little"))
    with open(path, "rb") as f:
        for i in range(group.num_columns):
            chunk = group.column(i)
            leaf = chunk.path_in_schema
            if columns is not None and not any(leaf == c or leaf.startswith(c + ".") for c in columns):
                continue
            tag.update(leaf.encode() + b"\0")
            starts = [chunk.data_page_offset]
            if chunk.has_dictionary_page and chunk.dictionary_page_offset:
                starts.append(chunk.dictionary_page_offset)
            f.seek(min(starts))
            left = chunk.total_compressed_size
            while left > 0 and (piece := f.read(min(left, _PIECE))):
                tag.update(piece)
                left -= len(piece)
    return tag.digest()[:TAG_BYTES]
