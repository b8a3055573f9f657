"""Crash injection for the resume tests: ``BATCHGEN_FAULT=point:k`` SIGKILLs the run at the k-th ``point``.

Points: ``submit`` (the engine takes the k-th request: its batch is about to prefill), ``output`` (the k-th
finished output: others are mid-decode), ``torn`` (half-way through writing a record), ``flush`` (data
written, not yet fsynced), ``state`` (state file written, not yet renamed), ``part`` (a Parquet part
written, not yet renamed), ``finalize`` (the final Parquet file in place, parts not yet removed).

``BATCHGEN_FAULT_REPORT=path`` makes the kill write, just before it, a JSON report there: the point and a
snapshot from the caller (what the engine held for ``submit`` and ``output``, the fsynced size for
``flush``). The tests read it to check that the fault fired, in the state it is named for. Unset
(always, outside tests), every check is one attribute test.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Mapping
from typing import Any


class Faults:
    def __init__(self, spec: str | None = None, report: str | None = None) -> None:
        self.point, self.at = None, 0
        if spec:
            point, _, at = spec.partition(":")
            self.point, self.at = point, int(at or 1)
        self.report = report
        self._seen = 0

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
