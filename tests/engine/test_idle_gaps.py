"""The compute stream's idle gaps between steps (engine/idle_gaps.py), on events that record a clock."""

from __future__ import annotations

from batchgen.engine.idle_gaps import IdleGaps


class _Clock:
    now = 0.0


class _Event:
    """A timing event stand-in: ``record`` takes the clock's time, ``elapsed_time`` subtracts (ms)."""

    def __init__(self, clock: _Clock) -> None:
        self.clock, self.at = clock, None

    def record(self, stream) -> None:
        self.at = self.clock.now

    def elapsed_time(self, later: _Event) -> float:
        return later.at - self.at


def _run(gaps: IdleGaps, clock: _Clock, step: int, idle_before: float, busy: float) -> None:
    clock.now += idle_before
    gaps.start(step, None)
    clock.now += busy
    gaps.end(step, None)


def test_gaps_are_filed_under_the_step_that_waited():
    clock = _Clock()
    gaps = IdleGaps(lambda: _Event(clock))
    plan = [(0.0, "graph"), (0.2, "graph"), (5.0, "eager"), (0.1, "graph"), (1.5, "graph"), (0.3, "mixed")]
    plan.append((0.0, "graph"))
    for step, (idle, _) in enumerate(plan):  # one step in flight ahead, as the async engine runs
        _run(gaps, clock, step, idle, 1.0)
        if step:
            gaps.fetched(step - 1, plan[step - 1][1], 256, busy_ms=float(step))
    gaps.fetched(len(plan) - 1, "graph", 3, busy_ms=1.0)
    out = gaps.summary()
    # compute time by kind (step k: k + 1 ms, the last 1): graph 0, 1, 3, 4, 6; eager 2; mixed 5
    assert (out["busy_ms_graph_steps"], out["busy_ms_eager_steps"], out["busy_ms_mixed_steps"]) == (13, 3, 6)
    assert out["idle_ms_before_graph_steps"] == round(0.2 + 0.1 + 1.5, 1)
    assert (out["idle_ms_before_eager_steps"], out["idle_ms_before_mixed_steps"]) == (5.0, 0.3)
    assert (out["graph_steps"], out["eager_steps"], out["mixed_steps"], out["gaps_over_1_ms"]) == (5, 1, 1, 2)
    assert [g["step"] for g in out["largest"]] == [2, 4, 5, 1, 3]  # the longest first, five kept
    assert out["largest"][0] == {"ms": 5.0, "step": 2, "kind": "eager", "rows": 256}


def test_a_step_after_a_break_in_the_sequence_counts_no_gap():
    """The first step, and one fetched after steps were skipped (a stream abandoned), have no
    predecessor to measure from."""
    clock = _Clock()
    gaps = IdleGaps(lambda: _Event(clock))
    _run(gaps, clock, 0, 9.0, 1.0)
    gaps.fetched(0, "graph", 1)
    _run(gaps, clock, 7, 4.0, 1.0)
    gaps.fetched(7, "graph", 1)
    assert gaps.summary()["idle_ms_before_graph_steps"] == 0.0
