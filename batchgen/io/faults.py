"""Crash injection for the resume tests: ``BATCHGEN_FAULT=point:k`` SIGKILLs the run at the k-th ``point``.

Points: ``submit`` (the engine takes the k-th request: its batch is about to prefill), ``output`` (the k-th
finished output: others are mid-decode), ``torn`` (half-way through writing a record), ``flush`` (data
written, not yet fsynced), ``state`` (state file written, not yet renamed), ``part`` (a Parquet part
written, not yet renamed), ``finalize`` (the final Parquet file in place, parts not yet removed).
Unset (always, outside tests), every check is one attribute test.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping


class Faults:
    def __init__(self, spec: str | None = None) -> None:
        self.point, self.at = None, 0
        if spec:
            point, _, at = spec.partition(":")
            self.point, self.at = point, int(at or 1)
        self._seen = 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Faults:
        return cls(env.get("BATCHGEN_FAULT"))

    def due(self, point: str) -> bool:
        """True when this call is the k-th visit of the armed point."""
        if point != self.point:
            return False
        self._seen += 1
        return self._seen == self.at

    def hit(self, point: str) -> None:
        if self.due(point):
            self.kill()

    @staticmethod
    def kill() -> None:
        os.kill(os.getpid(), signal.SIGKILL)
