"""Where a CUDA run's compute stream sat idle between steps (a small model's GPU waits for the host).
Timing events on the compute stream mark each step's start and end; when the host fetches step N,
the gap since step N-1 ended is known, and is filed under what step N was: ``graph``, a decode step (a
replay, or its bucket's first uses before the capture); ``eager``, a step with new prompts or their
chunks run eagerly; ``mixed``, such a step replayed by its token bucket's graph (mixed_graphs.py).
The stats file's ``engine.gpu_idle`` says whether the idle time is a few long waits (wave transitions)
or many short ones (host jitter between decode steps).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

import torch

RING = 4  # step marks kept: steps N-1 and N at fetch, N+1 (and a masked N+2 part) already launched
LONG_GAP_MS = 1.0
KEPT_LARGEST = 5


class IdleGaps:
    def __init__(self, make_event: Callable[[], Any] | None = None) -> None:
        make_event = make_event or (lambda: torch.cuda.Event(enable_timing=True))
        self._marks = [(make_event(), make_event()) for _ in range(RING)]
        self._last_fetched: int | None = None
        kinds = ("graph", "eager", "mixed", "verify")  # verify: a speculative verify step's graph
        self.idle_ms = dict.fromkeys(kinds, 0.0)
        self.steps = dict.fromkeys(kinds, 0)
        self.busy_ms = dict.fromkeys(kinds, 0.0)  # compute time, by the same kinds
        self.long_gaps = 0  # gaps over LONG_GAP_MS
        self._largest: list[tuple[float, int, str, int]] = []  # min-heap of (ms, step, kind, samples)

    def start(self, step_id: int, stream: torch.cuda.Stream) -> None:
        self._marks[step_id % RING][0].record(stream)

    def end(self, step_id: int, stream: torch.cuda.Stream) -> None:
        """After the step's last compute work (a masked step's sampling part re-marks its end)."""
        self._marks[step_id % RING][1].record(stream)

    def fetched(self, step_id: int, kind: str, samples: int, busy_ms: float = 0.0) -> float:
        """Step ``step_id``'s tokens reached the host: its start and its predecessor's end have happened
        (``busy_ms``: its compute time). Returns the idle ms before it (0 when its predecessor was not
        fetched just before)."""
        self.steps[kind] += 1
        self.busy_ms[kind] += busy_ms
        gap = 0.0
        if self._last_fetched == step_id - 1:
            gap = self._marks[(step_id - 1) % RING][1].elapsed_time(self._marks[step_id % RING][0])
            self.idle_ms[kind] += gap
            self.long_gaps += gap > LONG_GAP_MS
            heapq.heappush(self._largest, (gap, step_id, kind, samples))
            if len(self._largest) > KEPT_LARGEST:
                heapq.heappop(self._largest)
        self._last_fetched = step_id
        return gap

    def summary(self) -> dict:
        largest = sorted(self._largest, reverse=True)
        return {
            "idle_ms_before_graph_steps": round(self.idle_ms["graph"], 1),
            "idle_ms_before_eager_steps": round(self.idle_ms["eager"], 1),
            "idle_ms_before_mixed_steps": round(self.idle_ms["mixed"], 1),
            "graph_steps": self.steps["graph"],
            "eager_steps": self.steps["eager"],
            "mixed_steps": self.steps["mixed"],
            "busy_ms_graph_steps": round(self.busy_ms["graph"], 1),
            "busy_ms_eager_steps": round(self.busy_ms["eager"], 1),
            "busy_ms_mixed_steps": round(self.busy_ms["mixed"], 1),
            f"gaps_over_{LONG_GAP_MS:g}_ms": self.long_gaps,
            "largest": [{"ms": round(ms, 2), "step": s, "kind": k, "rows": n} for ms, s, k, n in largest],
        }
