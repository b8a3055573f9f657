"""The engine's request iterator in ``batchgen run`` (app/feed.py): chunks from the prompt thread handed
on one request at a time; a drain leaves what was not handed on for the resume; an empty queue is the
helper threads' turn."""

from __future__ import annotations

import contextlib
import queue
import threading
from types import SimpleNamespace

import pytest

from batchgen.app.feed import Feed
from batchgen.app.prepare import END
from batchgen.config import SamplingParams
from batchgen.engine.completions import GenerationRequest
from batchgen.io.faults import Faults


def _feed(items: list, turns=None) -> tuple[Feed, SimpleNamespace]:
    preparer = SimpleNamespace(queue=queue.Queue())
    for item in items:
        preparer.queue.put(item)
    signals = SimpleNamespace(draining=threading.Event())
    return Feed(preparer, signals, threading.Event(), Faults(), lambda: None, turns), signals


def _requests(*indices: int) -> list[GenerationRequest]:
    return [GenerationRequest(i, [3, 4], SamplingParams()) for i in indices]


def test_chunks_are_handed_on_one_request_at_a_time_in_order():
    feed, _ = _feed([_requests(0, 1, 2), _requests(3), END])
    assert [r.index for r in feed] == [0, 1, 2, 3]
    assert feed.ended


def test_a_drain_mid_chunk_hands_on_nothing_more_and_is_not_the_end():
    feed, signals = _feed([_requests(0, 1, 2), _requests(3), END])
    assert [next(feed).index, next(feed).index] == [0, 1]
    signals.draining.set()
    with pytest.raises(StopIteration):
        next(feed)
    assert not feed.ended  # rows 2 and 3 never reached the engine: the resume does them


def test_a_failure_elsewhere_stops_the_engine_with_it():
    feed, _ = _feed([_requests(0), END])
    feed.failure = lambda: OSError("disk full")
    with pytest.raises(OSError, match="disk full"):
        next(feed)


def test_waiting_on_an_empty_queue_is_the_helper_threads_turn():
    entered: list[bool] = []

    class Turns:
        @contextlib.contextmanager
        def engine_waits(self):
            entered.append(True)
            yield

    feed, _ = _feed([], Turns())
    with pytest.raises(queue.Empty):
        feed._get()
    assert entered == [True]
    feed.preparer.queue.put(_requests(5))
    assert [r.index for r in feed._get()] == [5] and entered == [True]  # ready: no wait, no turn
