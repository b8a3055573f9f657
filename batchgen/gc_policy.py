"""Python's garbage collector while a run generates.

A full (generation 2) collection walks every tracked object. Once torch and transformers are imported
and a model is built, that is hundreds of thousands of objects, and one such pass is a stall the GPU
sees as idle time between steps. ``frozen_heap`` moves everything that exists when generation starts
into the permanent generation (``gc.freeze``), so later collections only walk the run's own objects
(requests, outputs), and their pauses shrink by far (``docs/results.md``). Inside the block the youngest
generation is also collected less often (every ``YOUNG_OBJECTS`` net new objects instead of Python's
default): a request, its token lists and its output live for hundreds of steps, so at the default each
was walked by several collections while alive; at ``YOUNG_OBJECTS`` most are gone (freed by reference
counting) before one runs, so far fewer collections run for about the same longest pause. ``GcPauses``
times every collection made inside the block, so a run's stats file shows what the collector still
costs.
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

YOUNG_OBJECTS = 10_000  # generation 0's threshold while a run generates (Python's default: 700)


class GcPauses:
    """Collections seen through ``gc.callbacks``: count, total and longest pause, per generation."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._started: float | None = None
        self._pauses: dict[int, list[float]] = {}  # generation -> pause seconds

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = self._clock()
        elif self._started is not None:
            self._pauses.setdefault(info["generation"], []).append(self._clock() - self._started)
            self._started = None

    def summary(self) -> dict[str, Any]:
        every = [p for pauses in self._pauses.values() for p in pauses]
        return {
            **_totals(every, "collections"),
            "by_generation": {str(gen): _totals(p, "count") for gen, p in sorted(self._pauses.items())},
        }


def _totals(pauses: list[float], count_key: str) -> dict[str, Any]:
    return {
        count_key: len(pauses),
        "total_ms": round(1e3 * sum(pauses), 2),
        "longest_ms": round(1e3 * max(pauses, default=0.0), 2),
    }


@contextlib.contextmanager
def frozen_heap(pauses: GcPauses | None = None, collect_first: bool = True) -> Iterator[GcPauses]:
    """Collect once, then freeze what is left and collect the young generation less often for the
    duration of the block, timing the block's collections in ``pauses``; restore both after.
    ``BATCHGEN_GC_FREEZE=0`` only times them. Inside a heap frozen already (a ``batchgen run`` around
    ``LLM.stream``) the block leaves the collector alone: unfreezing on its way out would thaw the
    enclosing block's heap. ``collect_first`` False skips the full collection on the way in (freezing
    itself costs nothing), for blocks entered often: each ``LLM.generate`` call."""
    if gc.get_freeze_count():  # frozen already (an enclosing block, or the caller's own policy): theirs
        yield pauses if pauses is not None else GcPauses()
        return
    freeze = os.environ.get("BATCHGEN_GC_FREEZE", "1") != "0"  # 0: the collector as Python sets it
    thresholds = gc.get_threshold()
    if freeze:
        if collect_first:  # else garbage made before the block waits for its end to be collected
            gc.collect()
        gc.freeze()
        if thresholds[0]:  # 0: automatic collection is off; leave it so
            gc.set_threshold(max(YOUNG_OBJECTS, thresholds[0]), *thresholds[1:])
    pauses = pauses if pauses is not None else GcPauses()
    gc.callbacks.append(pauses)
    try:
        yield pauses
    finally:
        gc.callbacks.remove(pauses)
        if freeze:
            gc.set_threshold(*thresholds)
            gc.unfreeze()
