"""Python's garbage collector while a run generates.

A full (generation 2) collection walks every tracked object. Once torch and transformers are imported
and a model is built, that is hundreds of thousands of objects: one such pass took 219-224 ms in
``scripts/bench_host.py --library-heap`` (the engine loop, 2-core VM), a stall the GPU sees as idle time
between steps. ``frozen_heap`` moves everything that exists when generation starts into the permanent
generation (``gc.freeze``), so later collections only walk the run's own objects (requests, outputs):
the same loop's collections then paused at most 4-6 ms (``docs/results.md``).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Collect once, then freeze what is left for the duration of the block; unfreeze after."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
