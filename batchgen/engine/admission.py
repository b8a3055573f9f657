"""When new rows join a running batch on a GPU: rent or buy (small models).

A step that starts new prompts costs more than a decode step. Eagerly, a small model's such step is
host-bound: its kernel launches take many times as long as a decode graph's replay; replayed from its
token bucket's graph (mixed_graphs.py) it costs its padded GPU work. When rows end a few at a time (EOS,
or per-row lengths, as in real jobs), admitting each new row as soon as one is free makes nearly every
step such a step: B7 with staggered row lengths (B7s) ran at a fraction of B7's throughput
(docs/results.md).

So a free row waits, as in the ski-rental problem. Each step that holds new rows back leaves rows idle:
the rent, counted in row-steps (rows left empty that waiting requests could have used). A step with new
prompts costs about ``max_num_seqs`` rows x the decode steps its extra time would have run: the price.
New rows wait until the rent paid reaches the price; then one step admits all that fit, and the rent
starts over once some joined. A heuristic: the price is measured, not known, and rows left idle are not
all lost (a smaller decode step is a little faster). A step that runs a prompt chunk anyway, has no
decodes to protect, or whose waiting rows need more than its token budget admits at once; so does a
runner that measures no price: the CPU, where every step is eager, and large models, whose eager steps
are bound by the GPU's work, not by their launch.

Pure Python: the CUDA runner feeds ``StepCosts`` the times it measures; the scheduler keeps the rent.
"""

from __future__ import annotations

import statistics
from collections import deque

WINDOW = 8  # steps with new prompts remembered: the median of their extra costs prices the next
HOST_BOUND = 1.25  # an eager step busier on the GPU than this x its launch time hid the launch behind work
DECODE_WINDOW = 64  # graph steps remembered: the median of their periods is the decode step's
DECODE_EVERY = 16  # graph steps between two updates of that median
MAX_PRICE_STEPS = 64.0  # bound on the price, in decode steps: a bad measure must not hold rows for long


class StepCosts:
    """What a CUDA runner's steps cost: host launch time and GPU time of its eager steps, and the period
    of its graph steps on the GPU (busy + the idle gap before: when the host is slower than the replay,
    a step lasts as long as the host takes), decode steps apart from those with new prompts.
    ``decode_steps_per_join`` is the price of a step with new prompts, in decode steps."""

    def __init__(self) -> None:
        self._joins: deque[float] = deque(maxlen=WINDOW)  # ms a step with new prompts set; 0: free
        self._periods: deque[float] = deque(maxlen=DECODE_WINDOW)
        self._graph_steps = 0
        self._decode_ms = 0.0
        self._first_eager = True
        self.decode_steps_per_join = 0.0  # 0 until both kinds were measured

    def eager(self, launch_ms: float, busy_ms: float) -> None:
        if self._first_eager:  # a process's first eager step pays Triton's start: not a cost
            self._first_eager = False
            return
        # A launch hidden behind the GPU's work costs nothing: that work is the prompts' own.
        self._joins.append(0.0 if busy_ms > HOST_BOUND * launch_ms else launch_ms)
        self._update()

    def mixed(self, period_ms: float) -> None:
        """A step with new prompts replayed from its token bucket's graph (mixed_graphs.py)."""
        self._joins.append(period_ms)
        self._update()

    def graph(self, period_ms: float) -> None:
        """A decode graph step's period (a median: waves, captures and host pauses make long outliers)."""
        self._periods.append(period_ms)
        self._graph_steps += 1
        if self._graph_steps % DECODE_EVERY == 1:
            self._decode_ms = statistics.median(self._periods)
            self._update()

    def _update(self) -> None:
        if not self._joins or not self._decode_ms:
            return
        extra = statistics.median(max(0.0, ms - self._decode_ms) / self._decode_ms for ms in self._joins)
        self.decode_steps_per_join = min(extra, MAX_PRICE_STEPS)


class Rent:
    """The scheduler's side: row-steps new rows were held back for, against the price of admitting them."""

    def __init__(self) -> None:
        self.price = 0.0  # row-steps a step with new prompts costs; 0: admit at once
        self.paid = 0.0

    def holds(self, free_rows: int, waiting: int, joins_anyway: bool) -> bool:
        """Whether a step that decodes keeps ``waiting`` rows waiting; if so they pay for the free rows
        they leave idle."""
        if joins_anyway or not waiting or self.paid >= self.price:
            return False
        self.paid += min(free_rows, waiting)
        return True

    def settle(self) -> None:
        """Rows joined: the rent starts over."""
        self.paid = 0.0
