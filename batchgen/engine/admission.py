"""When new rows join a running batch on a GPU: rent or buy (issue 12, small models).

A step that starts new prompts runs eagerly: its prompts' lengths vary, so no decode graph fits it. On a
small model an eager step is host-bound: ~15 ms of kernel launches where a decode graph replays in
~1.3 ms (the embedded model on the H200). When rows end a few at a time (EOS, or per-row lengths, as in
real jobs), admitting each new row as soon as one is free makes nearly every step eager: B7 with row
lengths of 16-496 tokens ran at 17.4k tok/s, against 153k with every row 256 tokens long (docs/results.md).

So a free row waits, as in the ski-rental problem. Each step that holds new rows back leaves rows idle:
the rent, counted in row-steps (rows left empty that waiting requests could have used). An eager step
costs about ``max_num_seqs`` rows x the decode steps its extra launch time would have run: the price.
New rows wait until the rent paid reaches the price; then one eager step admits all that fit, and the
rent starts over once some joined. A heuristic: the price is measured, not known, and rows left idle
are not all lost (a smaller decode step is a little faster). A step that is eager anyway (a prompt's
next chunk), has no decodes to protect, or whose waiting rows need more than its token budget admits at
once; so does a runner that measures no price: the CPU, where every step is eager, and large models,
whose eager steps are bound by the GPU's work, not by their launch.

Pure Python: the CUDA runner feeds ``StepCosts`` the times it measures; the scheduler keeps the rent.
"""

from __future__ import annotations

import statistics
from collections import deque

WINDOW = 8  # eager steps remembered: the median of their extra costs prices the next
HOST_BOUND = 1.25  # an eager step busier on the GPU than this x its launch time hid the launch behind work
DECODE_WINDOW = 64  # graph steps remembered: the median of their periods is the decode step's
DECODE_EVERY = 16  # graph steps between two updates of that median
MAX_PRICE_STEPS = 64.0  # bound on the price, in decode steps: a bad measure must not hold rows for long


class StepCosts:
    """What a CUDA runner's steps cost: host launch time and GPU time of its eager steps, and the period
    of its decode graph steps on the GPU (busy + the idle gap before: when the host is slower than the
    replay, a decode step lasts as long as the host takes). ``decode_steps_per_eager`` is the price of
    an eager step, in decode steps."""

    def __init__(self) -> None:
        self._eager: deque[tuple[float, float]] = deque(maxlen=WINDOW)  # (launch ms, busy ms)
        self._periods: deque[float] = deque(maxlen=DECODE_WINDOW)
        self._graph_steps = 0
        self._decode_ms = 0.0
        self._first_eager = True
        self.decode_steps_per_eager = 0.0  # 0 until both kinds were measured

    def eager(self, launch_ms: float, busy_ms: float) -> None:
        if self._first_eager:  # a process's first eager step pays Triton's start (~0.3-0.8 s): not a cost
            self._first_eager = False
            return
        self._eager.append((launch_ms, busy_ms))
        self._update()

    def graph(self, period_ms: float) -> None:
        """A decode graph step's period (a median: waves, captures and host pauses make long outliers)."""
        self._periods.append(period_ms)
        self._graph_steps += 1
        if self._graph_steps % DECODE_EVERY == 1:
            self._decode_ms = statistics.median(self._periods)
            self._update()

    def _update(self) -> None:
        if not self._eager or not self._decode_ms:
            return
        extra = statistics.median(self._extra_steps(launch, busy) for launch, busy in self._eager)
        self.decode_steps_per_eager = min(extra, MAX_PRICE_STEPS)

    def _extra_steps(self, launch_ms: float, busy_ms: float) -> float:
        """Decode steps one eager step cost beyond its own decodes: its launch time past a decode step's,
        when the launch set its time; nothing when the GPU's work did (it hid the launch)."""
        if busy_ms > HOST_BOUND * launch_ms:
            return 0.0
        return max(0.0, launch_ms - self._decode_ms) / self._decode_ms


class Rent:
    """The scheduler's side: row-steps new rows were held back for, against the price of admitting them."""

    def __init__(self) -> None:
        self.price = 0.0  # row-steps an eager step costs; 0: admit at once
        self.paid = 0.0

    def holds(self, free_rows: int, waiting: int, eager_anyway: bool) -> bool:
        """Whether a step that decodes keeps ``waiting`` rows waiting; if so they pay for the free rows
        they leave idle."""
        if eager_anyway or not waiting or self.paid >= self.price:
            return False
        self.paid += min(free_rows, waiting)
        return True

    def settle(self) -> None:
        """Rows joined: the rent starts over."""
        self.paid = 0.0
