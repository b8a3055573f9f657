"""Every runner has the whole ``Runner`` protocol, so the engine and ``LLM`` read its members instead of
probing for them; rank 0's tensor-parallel runner answers each from its own runner, not the defaults."""

from __future__ import annotations

import pytest

from batchgen.engine.cuda_runner import CudaRunner
from batchgen.engine.runner import EagerRunner
from batchgen.engine.runner_protocol import Runner
from batchgen.tensor_parallel.rank0_runner import TensorParallelRunner

DEFAULTED = ["tells_waits", "buckets", "capture_after", "graph_memory", "gpu_busy_s", "prep_s", "replay_s",
             "idle", "step_costs", "ready"]  # fmt: skip
REQUIRED = ["launch", "mask_buffer", "sample", "fetch", "reset"]


@pytest.mark.parametrize("runner", [EagerRunner, CudaRunner, TensorParallelRunner], ids=lambda c: c.__name__)
def test_every_runner_has_the_protocol(runner):
    assert Runner in runner.__mro__  # its defaults are inherited, not copied
    for name in [*DEFAULTED, *REQUIRED, "capture_all", "busy_stats"]:
        assert hasattr(runner, name), name
    for name in REQUIRED:  # the protocol's own are stubs: each runner has its own
        assert getattr(runner, name) is not getattr(Runner, name), name


def test_the_tensor_parallel_runner_answers_with_rank_0s_runner():
    """No member falls back to the protocol's default (a one-process runner's zeros) or forwards by
    ``__getattr__``."""
    assert "__getattr__" not in vars(TensorParallelRunner)
    missing = [name for name in DEFAULTED if name not in vars(TensorParallelRunner)]
    assert not missing

    class Local(Runner):
        tells_waits, buckets, capture_after, gpu_busy_s, prep_s, replay_s = True, (1, 2), 4, 1.5, 0.5, 0.25

    class Pool:
        def check(self) -> None:
            pass

    tp = TensorParallelRunner(Local(), Pool())
    assert (tp.tells_waits, tp.buckets, tp.capture_after) == (True, (1, 2), 4)
    assert tp.busy_stats() == {"gpu_busy_s": 1.5, "prep_s": 0.5, "replay_s": 0.25}
