"""CPU thread policy: the starting count, --threads, and the governor's decisions on fed samples; the GIL's
switch interval and the helper threads' turns while the engine generates."""

from __future__ import annotations

import threading

import pytest
import torch

from batchgen import threads
from batchgen.threads import Sample, ThreadGovernor


@pytest.fixture(autouse=True)
def keep_torch_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


class Feed:
    """Samples made to order: each ``add`` advances the clock and this process's wait / idle totals."""

    def __init__(self) -> None:
        self.now, self.waited, self.idle = 0.0, 0.0, 0.0

    def sample(self) -> Sample:
        return Sample(self.now, {1: self.waited}, self.idle)

    def add(self, seconds: float, waiting_cores: float, idle_cores: float) -> None:
        self.now += seconds
        self.waited += waiting_cores * seconds
        self.idle += idle_cores * seconds


def _governor(start: int, limit: int, feed: Feed) -> ThreadGovernor:
    return ThreadGovernor(start, limit, sampler=feed.sample, clock=lambda: feed.now)


def test_steps_down_on_contention_and_up_on_idle_cores():
    feed = Feed()
    gov = _governor(2, 2, feed)
    feed.add(3, waiting_cores=0.6, idle_cores=0.0)  # a neighbour took a core: our threads queue
    gov.tick()
    assert gov.threads == 1 and torch.get_num_threads() == 1
    feed.add(3, waiting_cores=0.0, idle_cores=1.0)  # it left, but the hold after a step down applies
    gov.tick()
    assert gov.threads == 1
    feed.add(10, waiting_cores=0.0, idle_cores=1.0)
    gov.tick()
    assert gov.threads == 2 and torch.get_num_threads() == 2


def test_holds_still_between_looks_and_within_bounds():
    feed = Feed()
    gov = _governor(1, 2, feed)
    feed.add(1, waiting_cores=0.0, idle_cores=1.0)  # before the interval: no look yet
    gov.tick()
    assert gov.threads == 1
    feed.add(2, waiting_cores=0.0, idle_cores=0.5)  # half a core idle is not a free core
    gov.tick()
    assert gov.threads == 1
    feed.add(3, waiting_cores=2.0, idle_cores=0.0)  # contention at one thread: nothing lower to go to
    gov.tick()
    assert gov.threads == 1 and gov.changes == 0


def test_hold_doubles_after_each_step_down():
    feed = Feed()
    gov = _governor(2, 2, feed)
    for hold in (10, 20, 40):
        feed.add(3, waiting_cores=1.0, idle_cores=0.0)
        gov.tick()
        assert gov.threads == 1
        feed.add(hold - 1, waiting_cores=0.0, idle_cores=1.0)
        gov.tick()
        assert gov.threads == 1  # still held
        feed.add(3, waiting_cores=0.0, idle_cores=1.0)
        gov.tick()
        assert gov.threads == 2


def test_explicit_threads_are_fixed_and_cuda_untouched(monkeypatch):
    assert threads.set_cpu_threads(1, torch.device("cpu")) is None and torch.get_num_threads() == 1
    before = torch.get_num_threads()
    assert threads.set_cpu_threads(None, torch.device("cuda")) is None
    assert torch.get_num_threads() == before
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert threads.max_threads() == 1 and threads.default_threads() == 1
    assert threads.set_cpu_threads(None, torch.device("cpu")) is None  # nothing to govern with one core


def test_a_lower_torch_count_set_beforehand_caps_the_automatic_one(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "available_cores", lambda: 8)
    monkeypatch.setattr(threads, "busy_cores", lambda: 0)
    monkeypatch.setattr(threads, "_ours", None)
    torch.set_num_threads(1)  # a library user's (or a test's) own choice
    assert threads.set_cpu_threads(None, torch.device("cpu")) is None and torch.get_num_threads() == 1
    torch.set_num_threads(3)
    gov = threads.set_cpu_threads(None, torch.device("cpu"))
    assert gov.limit == 3 and torch.get_num_threads() == 3
    gov._set(2, "test")  # batchgen's own lower count is no cap for the next LLM
    assert threads.max_threads() == 8


def test_default_leaves_busy_cores_alone(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "available_cores", lambda: 8)
    monkeypatch.setattr(threads, "_ours", torch.get_num_threads())  # torch's count is no cap
    clock = iter([0.0, 1.0, 10.0, 11.0])  # two 1-second windows
    monkeypatch.setattr(threads.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(threads.time, "sleep", lambda s: None)
    idle = iter([100.0, 105.3, 200.0, 200.2])  # 5.3 idle cores, then 0.2
    monkeypatch.setattr(threads, "_idle_seconds", lambda: next(idle))
    assert threads.default_threads() == 5  # 8 - round(2.7): the cores idle now, not a minute ago
    assert threads.default_threads() == 1


def test_without_proc_the_load_average_counts_busy_cores(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "available_cores", lambda: 8)
    monkeypatch.setattr(threads, "_ours", torch.get_num_threads())

    def no_proc():
        raise OSError("no /proc/stat")

    monkeypatch.setattr(threads, "_idle_seconds", no_proc)
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (2.7, 0.0, 0.0))
    assert threads.default_threads() == 6
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (20.0, 0.0, 0.0))
    assert threads.default_threads() == 1


def test_reads_this_process_from_proc():
    sample = threads.read_sample()
    if sample is None:
        pytest.skip("needs /proc")
    assert sample.waited_s and all(w >= 0 for w in sample.waited_s.values()) and sample.idle_s >= 0


def test_engine_switching_shortens_the_gil_interval_and_restores_it():
    import sys

    old = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.005)
        with threads.engine_switching():
            assert sys.getswitchinterval() == pytest.approx(threads.ENGINE_SWITCH_S)
        assert sys.getswitchinterval() == pytest.approx(0.005)
        sys.setswitchinterval(1e-5)  # a caller's shorter interval is never lengthened
        with threads.engine_switching():
            assert sys.getswitchinterval() == pytest.approx(1e-5)
    finally:
        sys.setswitchinterval(old)


def test_helpers_take_their_turns_while_the_engine_waits_on_the_device():
    turns = threads.HostTurns(timeout_s=60)
    turns.take()  # no generation: at once
    done: list[str] = []

    def helper(name: str) -> threading.Thread:
        thread = threading.Thread(target=lambda: (turns.take(), done.append(name)))
        thread.start()
        return thread

    with turns.generating():
        first = helper("first")
        first.join(0.2)
        assert first.is_alive() and not turns.helpers_turn  # the engine is busy: the helper waits
        with turns.engine_waits():
            assert turns.helpers_turn
            first.join(60)
        assert done == ["first"] and not turns.helpers_turn  # the engine's again
        second = helper("second")
        second.join(0.2)
        assert second.is_alive()
    second.join(60)  # the generation ended: open for good
    assert done == ["first", "second"] and turns.helpers_turn


def test_after_one_timed_out_wait_helpers_run_free_until_the_engine_waits_again():
    """A host-bound engine (it never blocks) costs a helper one wait of ``timeout_s``, not one per unit:
    the writer must not fall behind. The engine's next wait restores the turns."""
    turns = threads.HostTurns(timeout_s=0.01)
    with turns.generating():
        assert not turns.helpers_turn
        turns.take()  # times out
        assert turns.helpers_turn  # ... so the next ones return at once
        for _ in range(3):
            turns.take()
        with turns.engine_waits():
            pass
        assert not turns.helpers_turn  # the engine waited since: turns again
