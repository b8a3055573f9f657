"""Rank 0's runner in a tensor-parallel job: every order goes to the workers first, then runs here.

The workers receive a step's host inputs while rank 0 copies its own to the device, and each rank runs
the seed's pipeline itself (streams, two slots, the step's graph, carry-over from its own sampled
tokens): no host round trip per step, and nothing comes back but at the end (their busy time).
"""

from __future__ import annotations

from typing import Any

from batchgen.engine.batch import StepInputs
from batchgen.engine.runner import StepResult
from batchgen.engine.step_sampling import GREEDY, SamplingFeatures
from batchgen.tensor_parallel.launch import WorkerPool
from batchgen.tensor_parallel.messages import Capture, Launch, Reset, Sample, Stats, TimeAllReduce


class TensorParallelRunner:
    def __init__(self, local, pool: WorkerPool) -> None:
        self.local, self.pool = local, pool
        local.check_alive = pool.check  # rank 0's waits notice a dead rank instead of hanging
        self._mask = None  # the token masks of the masked step being sampled

    def __getattr__(self, name: str) -> Any:  # forward, kv_caches, buckets, gpu_busy_s, ...
        return getattr(self.local, name)

    def launch(self, inputs: StepInputs):
        self.pool.send(Launch(inputs))
        return self.local.launch(inputs)

    def mask_buffer(self, handle, width: int):
        self._mask = self.local.mask_buffer(handle, width)
        return self._mask

    def sample(self, handle) -> None:
        """A masked step's sampling: the token masks rank 0 filled go to every rank with the order."""
        self.pool.send(Sample(self._mask.numpy()))
        self._mask = None
        self.local.sample(handle)

    def fetch(self, handle) -> StepResult:
        self.pool.check()
        return self.local.fetch(handle)

    def reset(self) -> None:
        self.pool.send(Reset())
        self.local.reset()

    def capture_all(
        self, features: SamplingFeatures = GREEDY, progress: bool = True,
        mask_width: int | None = None,
    ) -> None:  # fmt: skip
        self.pool.send(Capture(features, mask_width))
        self.local.capture_all(features, progress=progress, mask_width=mask_width)

    def rank_stats(self) -> list[dict]:
        """Every rank's busy and host-prep time (rank 0 first)."""
        return self.pool.request(Stats(), lambda: runner_stats(self.local))

    def time_all_reduce(self, shape: tuple[int, ...], count: int) -> list[float]:
        """Every rank's median ms for ``count`` graph-captured all-reduces of ``shape`` (the roofline's
        communication term), run on the job's own process group."""
        group = self.pool.group
        return self.pool.request(TimeAllReduce(shape, count), lambda: group.time_all_reduce(shape, count))


def runner_stats(runner) -> dict:
    return {name: getattr(runner, name, 0.0) for name in ("gpu_busy_s", "prep_s", "replay_s")}
