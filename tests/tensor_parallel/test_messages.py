"""The orders between tensor-parallel ranks: each survives its one encoding, and a worker refuses an
order it does not know instead of dropping it (a dropped order would leave the ranks out of step)."""

from __future__ import annotations

from multiprocessing import Pipe

import numpy as np
import pytest

from batchgen.engine.step_sampling import GREEDY
from batchgen.tensor_parallel import messages
from batchgen.tensor_parallel.messages import (
    Capture,
    Reset,
    Sample,
    Stats,
    Stop,
    TimeAllReduce,
    UnknownMessage,
)
from batchgen.tensor_parallel.worker import serve

ORDERS = [
    messages.Init({"config": 1}, ("files",), ("rendezvous",)),
    messages.Launch("the step's inputs"),
    Capture(GREEDY, None),
    Capture(GREEDY._replace(sampling=True), 64),
    Reset(),
    Stats(),
    TimeAllReduce((8, 4096), 16),
    Stop(),
]


@pytest.mark.parametrize("order", ORDERS, ids=lambda order: type(order).__name__)
def test_every_order_survives_its_encoding(order):
    raw = messages.encode(order)
    assert raw[0] == order.TAG and isinstance(raw, tuple)
    assert messages.decode(raw) == order


def test_a_token_mask_survives_its_encoding():
    masks = np.arange(6, dtype=np.int32).reshape(2, 3)
    order = messages.decode(messages.encode(Sample(masks)))
    assert isinstance(order, Sample) and np.array_equal(order.masks, masks)


@pytest.mark.parametrize("raw", [("no_such_order",), (), "stop", ("stats", "unexpected field")])
def test_an_unknown_or_malformed_message_is_refused(raw):
    with pytest.raises(UnknownMessage, match="tensor-parallel message"):
        messages.decode(raw)


def test_only_orders_are_encoded():
    with pytest.raises(UnknownMessage, match="not a tensor-parallel order"):
        messages.encode(("launch", "inputs"))


class _Runner:
    """Records the orders the worker runs (it has no step in flight, so none is fetched)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def reset(self) -> None:
        self.calls.append("reset")


def test_a_worker_raises_on_an_unknown_message_instead_of_dropping_it():
    worker_end, rank0_end = Pipe()
    runner = _Runner()
    rank0_end.send(messages.encode(Reset()))
    rank0_end.send(("no_such_order", 1, 2))
    rank0_end.send(messages.encode(Stop()))
    with pytest.raises(UnknownMessage, match="unknown tensor-parallel message 'no_such_order'"):
        serve(worker_end, runner, group=None)
    assert runner.calls == ["reset"]  # the order before it ran; nothing after it did


def test_a_worker_refuses_a_second_job_while_serving():
    worker_end, rank0_end = Pipe()
    rank0_end.send(messages.encode(messages.Init(None, None, None)))
    rank0_end.send(messages.encode(Stop()))  # a worker that dropped the order would return here
    with pytest.raises(UnknownMessage, match="takes no Init order"):
        serve(worker_end, _Runner(), group=None)
