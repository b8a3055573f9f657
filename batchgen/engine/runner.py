"""Model execution: host step inputs -> device tensors -> forward + sampling -> sampled tokens.

``EagerRunner`` runs each step eagerly on the current device; the engine drives it one step ahead of
postprocessing in asynchronous mode, so a decode's input token may be the previous step's sampled
token: it is patched in on the device from the previous step's output (carry-over), never via the host.

A step with constrained rows (``inputs.masked``, structured output) runs in two parts: ``launch``
computes its logits, then the engine fills the token masks into ``mask_buffer(handle)`` once the tokens
they depend on are known, and ``sample(handle)`` samples. Every runner has these three calls.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from batchgen.engine.batch import StepInputs
from batchgen.engine.sampler import SamplingTensors, sample
from batchgen.model.attention import PagedContext
from batchgen.model.backends import KernelBackend
from batchgen.model.forward import ModelForward


@dataclass
class StepOutput:
    step_id: int
    tokens: torch.Tensor | None  # [S] int64, on the device; None until a masked step is sampled
    logprobs: torch.Tensor | None  # [S] float32
    pending: tuple | None = None  # a masked step's (logits, sampling tensors, inputs) until sample()
    mask: torch.Tensor | None = None  # its [S, W] int32 token bitmask, filled by the engine


class StepResult(NamedTuple):
    step_id: int
    tokens: list[int]
    logprobs: list[float] | None


def apply_carry_over(input_ids: torch.Tensor, carry_rows: torch.Tensor, prev_tokens: torch.Tensor | None):
    """input_ids[i] = prev_tokens[carry_rows[i]] where carry_rows[i] >= 0 (a few tensor ops, no sync)."""
    if prev_tokens is None or prev_tokens.numel() == 0:
        return input_ids
    rows = carry_rows.clamp(min=0, max=prev_tokens.numel() - 1)
    return torch.where(carry_rows >= 0, prev_tokens[rows], input_ids)


# (logits [S, V / K] in the model dtype or float32, params, any_sampling, want_logprobs)
#   -> (tokens [S], logprobs [S] | None):
# ``sample`` in one process, ``parallel.sampling.ShardedSampler`` over a vocabulary split across ranks.
Sampler = Callable[[torch.Tensor, SamplingTensors, bool, bool], tuple[torch.Tensor, torch.Tensor | None]]


def forward_and_sample(
    forward: ModelForward,
    sampler: Sampler,
    input_ids: torch.Tensor,  # [T]
    positions: torch.Tensor,  # [T]
    logits_indices: torch.Tensor,  # [S]
    ctx: PagedContext,
    params: SamplingTensors,
    inputs: StepInputs,  # host-side flags: any_sampling, want_logprobs
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One step on the device: the model over the packed tokens, then sampling of the kept rows."""
    logits = forward(input_ids, positions, logits_indices, ctx)  # [S, V / K], widened if the step samples
    return sampler(logits, params, inputs.any_sampling, inputs.want_logprobs)


class EagerRunner:
    def __init__(
        self,
        forward: ModelForward,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        backend: KernelBackend,
        device: torch.device,
        sampler: Sampler = sample,
    ) -> None:
        self.forward = forward
        self.sampler = sampler
        self.kv_caches = kv_caches
        self.backend = backend
        self.device = device
        self._prev: StepOutput | None = None

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(array).to(self.device, non_blocking=True)

    def _context(self, inputs: StepInputs) -> PagedContext:
        return PagedContext(
            self.kv_caches,
            self._tensor(inputs.slot_mapping),
            self._tensor(inputs.cu_seqlens_q),
            self._tensor(inputs.seq_lens),
            self._tensor(inputs.block_tables),
            inputs.max_q_len,
            inputs.max_seq_len,
            self.backend,
        )

    def _sampling(self, inputs: StepInputs) -> SamplingTensors:
        return SamplingTensors(*(self._tensor(a) for a in (
            inputs.temperature, inputs.top_p, inputs.top_k, inputs.rng_keys, inputs.rng_steps
        )))  # fmt: skip

    @torch.inference_mode()
    def launch(self, inputs: StepInputs) -> StepOutput:
        prev = self._prev
        if (inputs.carry_rows >= 0).any() and (
            prev is None or prev.step_id != inputs.step_id - 1 or prev.tokens is None
        ):
            raise RuntimeError("carry-over needs the previous step's sampled output")
        input_ids = apply_carry_over(
            self._tensor(inputs.input_ids), self._tensor(inputs.carry_rows), prev and prev.tokens
        )
        args = (input_ids, self._tensor(inputs.positions), self._tensor(inputs.logits_indices))
        if inputs.masked:
            logits = self.forward(*args, self._context(inputs)).float()
            self._prev = StepOutput(inputs.step_id, None, None, (logits, self._sampling(inputs), inputs))
            return self._prev
        tokens, logprobs = forward_and_sample(
            self.forward, self.sampler, *args, self._context(inputs), self._sampling(inputs), inputs
        )
        self._prev = StepOutput(inputs.step_id, tokens, logprobs)
        return self._prev

    def mask_buffer(self, handle: StepOutput, width: int) -> torch.Tensor:
        """Where the engine writes a masked step's token bitmask: [S, width] int32 on the host."""
        handle.mask = torch.empty((len(handle.pending[2].logits_indices), width), dtype=torch.int32)
        return handle.mask

    @torch.inference_mode()
    def sample(self, handle: StepOutput) -> None:
        """Sample a masked step with the bitmask the engine wrote into ``mask_buffer(handle)``."""
        logits, params, inputs = handle.pending
        params = params._replace(token_mask=handle.mask.to(self.device, non_blocking=True))
        handle.tokens, handle.logprobs = self.sampler(
            logits, params, inputs.any_sampling, inputs.want_logprobs
        )
        handle.pending = handle.mask = None

    def reset(self) -> None:
        """Forget the previous step (after an abandoned stream: nothing may carry over from it)."""
        self._prev = None

    def fetch(self, out: StepOutput) -> StepResult:
        logprobs = out.logprobs.tolist() if out.logprobs is not None else None
        return StepResult(out.step_id, out.tokens.tolist(), logprobs)
