"""Fault injection for the resume tests.

``BATCHGEN_FAULT=point:k`` SIGKILLs the run at the k-th ``point``: ``submit`` (the engine takes the k-th
request: its batch is about to prefill), ``output`` (the k-th finished output: others are mid-decode),
``torn`` (half-way through writing a record), ``flush`` (data written, not yet fsynced), ``state`` (state
file written, not yet renamed), ``part`` (a Parquet part written, not yet renamed), ``finalize`` (the
final Parquet file in place, parts not yet removed; an OpenAI Batch output's response file written, not
yet renamed). ``merge`` has its own: ``merge-torn`` (the k-th shard joined into the temporary merged
file), ``merge-synced`` (that file complete and synced), ``merge-pending`` (the state saying the merge
is under way saved, the file not yet renamed), ``merge-renamed`` (the merged file in place, its final
state not yet saved).

``BATCHGEN_FAULT_REPORT=path`` makes the kill write, just before it, a JSON report there: the point and a
snapshot from the caller (what the engine held for ``submit`` and ``output``, the fsynced size for
``flush``). The tests read it to check that the fault fired, in the state it is named for.

``BATCHGEN_FAULT=nospace:N`` (or ``quota:N``, ``eio:N``) is a disk that takes N more bytes of the files
the run writes through ``Faults.open`` (the output, its Parquet parts and final file), then fails every
write with ENOSPC (EDQUOT, EIO), after a short write, as a real one does. Small files rewritten at every
flush (the state, through ``open_small``) take no room, so where the disk fills does not depend on how
often the run flushed, but they fail too once it is full.

Unset (always, outside tests), every check is one attribute test and ``open`` is the builtin.
"""

from __future__ import annotations

import errno
import io
import json
import os
import signal
from collections.abc import Callable, Mapping
from typing import Any

DISK_ERRORS = {"nospace": errno.ENOSPC, "quota": errno.EDQUOT, "eio": errno.EIO}


class Faults:
    def __init__(self, spec: str | None = None, report: str | None = None) -> None:
        self.point, self.at = None, 0
        if spec:
            point, _, at = spec.partition(":")
            self.point, self.at = point, int(at or 1)
        self.report = report
        self._seen = 0
        self.disk_left = self.at if self.point in DISK_ERRORS else None  # bytes the disk still takes

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Faults:
        return cls(env.get("BATCHGEN_FAULT"), env.get("BATCHGEN_FAULT_REPORT"))

    def due(self, point: str) -> bool:
        """True when this call is the k-th visit of the armed point."""
        if point != self.point:
            return False
        self._seen += 1
        return self._seen == self.at

    def hit(self, point: str, snapshot: Callable[[], dict[str, Any]] | None = None) -> None:
        """``snapshot``: the caller's state at the kill, for the report (called only when it fires)."""
        if self.due(point):
            self.kill(snapshot() if snapshot is not None else None)

    def kill(self, snapshot: dict[str, Any] | None = None) -> None:
        if self.report:  # written before the kill; the page cache keeps it through SIGKILL
            with open(self.report, "w") as f:
                json.dump({"point": self.point, "at": self.at, "snapshot": snapshot}, f)
        os.kill(os.getpid(), signal.SIGKILL)

    def open(self, path: str | os.PathLike, mode: str = "wb", buffering: int = -1, small: bool = False):
        """``open(path, mode, buffering)`` for writing (binary); on the filling disk when one is armed."""
        if self.disk_left is None:
            return open(path, mode, buffering=buffering)  # noqa: SIM115 - the caller closes it
        raw = _FillingFile(path, mode.replace("b", ""), self, small)
        return raw if buffering == 0 else io.BufferedWriter(raw)

    def open_small(self, path: str | os.PathLike, mode: str = "wb") -> Any:
        return self.open(path, mode, small=True)

    def take(self, wanted: int, small: bool = False) -> int:
        """Bytes of ``wanted`` the disk takes now (an error once it takes none)."""
        room = min(wanted, self.disk_left)
        if wanted and not room:
            code = DISK_ERRORS[self.point]
            raise OSError(code, os.strerror(code))
        if small:
            return wanted
        self.disk_left -= room
        return room


class _FillingFile(io.FileIO):
    def __init__(self, path: str | os.PathLike, mode: str, faults: Faults, small: bool) -> None:
        super().__init__(path, mode)
        self.faults, self.small = faults, small

    def write(self, data: Any) -> int:
        with memoryview(data) as view, view.cast("B") as flat:  # released at once: a bytearray may shrink
            return super().write(flat[: self.faults.take(len(flat), self.small)])
