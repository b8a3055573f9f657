"""Rank 0's runner in a tensor-parallel job: every order goes to the workers first, then runs here.

The workers receive a step's host inputs while rank 0 copies its own to the device, and each rank runs
the seed's pipeline itself (streams, two slots, the step's graph, carry-over from its own sampled
tokens): no host round trip per step, and nothing comes back but at the end (their busy time).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from batchgen.engine.batch import StepInputs
from batchgen.engine.runner_protocol import Runner, StepResult
from batchgen.engine.step_sampling import GREEDY, SamplingFeatures
from batchgen.tensor_parallel.launch import WorkerPool
from batchgen.tensor_parallel.messages import Capture, Launch, Reset, Sample, Stats, TimeAllReduce

if TYPE_CHECKING:
    from batchgen.engine.admission import StepCosts
    from batchgen.engine.idle_gaps import IdleGaps


class TensorParallelRunner(Runner):
    """Rank 0's own runner (``local``: its model, KV pool, graphs) behind the job's orders. What the
    engine reads of a runner is rank 0's; ``rank_stats`` asks every rank."""

    def __init__(self, local: Runner, pool: WorkerPool) -> None:
        self.local, self.pool = local, pool
        local.check_alive = pool.check  # rank 0's waits notice a dead rank instead of hanging
        self._mask = None  # the token masks of the masked step being sampled

    # --- rank 0's measures and graph policy ---------------------------------------------------------

    @property
    def tells_waits(self) -> bool:
        return self.local.tells_waits

    @property
    def buckets(self) -> Sequence[int]:
        return self.local.buckets

    @property
    def capture_after(self) -> int:
        return self.local.capture_after

    @property
    def graph_memory(self) -> Mapping[str, int]:
        return self.local.graph_memory

    @property
    def gpu_busy_s(self) -> float:
        return self.local.gpu_busy_s

    @property
    def prep_s(self) -> float:
        return self.local.prep_s

    @property
    def replay_s(self) -> float:
        return self.local.replay_s

    @property
    def idle(self) -> IdleGaps | None:
        return self.local.idle

    @property
    def step_costs(self) -> StepCosts | None:
        return self.local.step_costs

    def ready(self, handle) -> bool:
        return self.local.ready(handle)

    # --- orders: to the workers first, then here -----------------------------------------------------

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
        return self.pool.request(Stats(), self.local.busy_stats)

    def time_all_reduce(self, shape: tuple[int, ...], count: int) -> list[float]:
        """Every rank's median ms for ``count`` graph-captured all-reduces of ``shape`` (the roofline's
        communication term), run on the job's own process group."""
        group = self.pool.group
        return self.pool.request(TimeAllReduce(shape, count), lambda: group.time_all_reduce(shape, count))
