"""What the engine asks of a runner: the ``Runner`` protocol.

Three runners implement it: ``runner.EagerRunner`` (the CPU, and CUDA without the asynchronous runner),
``cuda_runner.CudaRunner`` (streams, slots, graphs) and ``tensor_parallel.rank0_runner.TensorParallelRunner``
(rank 0 of a tensor-parallel job). A step is ``launch``-ed, then (a masked step) its token masks filled
into ``mask_buffer`` and ``sample``-d, then ``fetch``-ed one step later in asynchronous mode.

The members a runner may have nothing for carry honest defaults here (a runner that computes each step in
``launch`` has every step ready, captures no graphs and measures no device time), so the engine and
``LLM`` read every member of every runner instead of probing for it; a runner inherits them by naming
``Runner`` as a base.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from batchgen.engine.step_sampling import GREEDY, SamplingFeatures

if TYPE_CHECKING:
    import torch

    from batchgen.engine.admission import StepCosts
    from batchgen.engine.batch import StepInputs
    from batchgen.engine.idle_gaps import IdleGaps


class StepResult(NamedTuple):
    step_id: int
    tokens: list[int]
    logprobs: list[float] | None
    top_ids: list[list[int]] | None = None  # per sampled row: the MAX_LOGPROBS most likely tokens
    top_logprobs: list[list[float]] | None = None  # ... and their log-probabilities
    # the step's scored prompt positions (StepInputs.prompt_rows), as PromptScores' fields on the host
    prompt: tuple[list[float], list[list[int]], list[list[float]]] | None = None


class Runner(Protocol):
    # Whether ``ready`` tells a step still on the device from a done one: the helper threads then work
    # while the engine waits for a step (threads.HostTurns).
    tells_waits: bool = False
    # Graphs: the decode batch sizes that have them (none: every step eager), and how many eager uses of
    # a step's key come before its graph is captured (0: every graph captured up front, or none at all).
    buckets: Sequence[int] = ()
    capture_after: int = 0
    graph_memory: Mapping[str, int] = MappingProxyType({})  # what the captured graphs cost, by slot count
    # Device time, measured where the runner can: the compute stream's busy seconds, the host's launch
    # seconds, and of those the seconds inside graph replays; the stream's gaps between steps.
    gpu_busy_s: float = 0.0
    prep_s: float = 0.0
    replay_s: float = 0.0
    idle: IdleGaps | None = None
    step_costs: StepCosts | None = None  # what a step with new prompts costs (admission.py); None: unmeasured

    def launch(self, inputs: StepInputs) -> Any:
        """Start a step; the handle goes back to ``fetch`` (and ``mask_buffer``/``sample``)."""
        ...

    def mask_buffer(self, handle: Any, width: int) -> torch.Tensor:
        """Where the engine writes a masked step's token bitmask: [S, width] int32 on the host."""
        ...

    def sample(self, handle: Any) -> None:
        """Sample a masked step with the bitmask written into ``mask_buffer(handle)``."""
        ...

    def fetch(self, handle: Any) -> StepResult:
        """The step's sampled tokens on the host (waits for the device)."""
        ...

    def reset(self) -> None:
        """Forget the previous step: nothing may carry over from an abandoned stream."""
        ...

    def ready(self, handle: Any) -> bool:
        """Whether ``fetch(handle)`` would return without waiting."""
        return True

    def warming(self, handle: Any) -> bool:
        """Whether the step ran a graph's warm-up or capture: its time is not a step's (the speculation
        policy's measure leaves it out)."""
        return False

    def capture_all(
        self, features: SamplingFeatures = GREEDY, progress: bool = True, mask_width: int | None = None
    ) -> None:
        """Capture every graph steps with ``features`` use (and masked steps' when ``mask_width``)."""

    def busy_stats(self) -> dict[str, float]:
        """This runner's device and host-launch time (a tensor-parallel rank's reply to rank 0)."""
        return {"gpu_busy_s": self.gpu_busy_s, "prep_s": self.prep_s, "replay_s": self.replay_s}
