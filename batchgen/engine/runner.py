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

import numpy as np
import torch

from batchgen.engine.batch import StepInputs
from batchgen.engine.row_tokens import RowTokens, ready_row_tokens
from batchgen.engine.runner_protocol import Runner, StepResult
from batchgen.engine.sampler import PromptScores, SampleOutput, SamplingTensors, sample, score_prompt
from batchgen.engine.step_sampling import SamplingFeatures
from batchgen.model.backends import KernelBackend, PagedContext
from batchgen.model.forward import ModelForward


@dataclass
class StepOutput:
    step_id: int
    sampled: SampleOutput | None  # on the device; None until a masked step is sampled
    pending: tuple | None = None  # a masked step's (logits, sampling tensors, inputs) until sample()
    mask: torch.Tensor | None = None  # its [S, W] int32 token bitmask, filled by the engine
    prompt: PromptScores | None = None  # its prompt positions' scores (prompt log-probabilities)

    @property
    def tokens(self) -> torch.Tensor | None:
        return None if self.sampled is None else self.sampled.tokens


def step_result(step_id: int, out: SampleOutput, prompt: PromptScores | None = None) -> StepResult:
    """A step's sampled output and prompt scores, on the host."""
    lists = [None if t is None else t.tolist() for t in out[1:]]
    scores = None if prompt is None else tuple(t.tolist() for t in prompt)
    return StepResult(step_id, out.tokens.tolist(), *lists, scores)


def full_vocab(sampler: Sampler) -> Callable[[torch.Tensor], torch.Tensor]:
    """How rows of a step's logits become whole-vocabulary rows (prompt log-probabilities): a sampler over a
    vocabulary split across ranks gathers them (``sharded_sampler.ShardedSampler.full_logits``)."""
    return getattr(sampler, "full_logits", lambda logits: logits)


def with_prompt_rows(
    logits_indices: torch.Tensor, inputs: StepInputs | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The rows the forward keeps: the sampled ones, then the scored prompt positions (``prompt_rows``);
    and those positions' targets on the device (None: no prompt log-probabilities this step)."""
    if inputs is None or inputs.prompt_rows is None:
        return logits_indices, None
    rows = torch.from_numpy(inputs.prompt_rows).to(logits_indices.device, non_blocking=True)
    targets = torch.from_numpy(inputs.prompt_targets).to(logits_indices.device, non_blocking=True)
    return torch.cat([logits_indices, rows]), targets


def apply_carry_over(input_ids: torch.Tensor, carry_rows: torch.Tensor, prev_tokens: torch.Tensor | None):
    """input_ids[i] = prev_tokens[carry_rows[i]] where carry_rows[i] >= 0 (a few tensor ops, no sync)."""
    if prev_tokens is None or prev_tokens.numel() == 0:
        return input_ids
    rows = carry_rows.clamp(min=0, max=prev_tokens.numel() - 1)
    return torch.where(carry_rows >= 0, prev_tokens[rows], input_ids)


# (logits [S, V / K] in the model dtype or float32, params, features) -> SampleOutput:
# ``sample`` in one process, ``sharded_sampler.ShardedSampler`` over a vocabulary split across ranks.
Sampler = Callable[[torch.Tensor, SamplingTensors, SamplingFeatures], SampleOutput]


class EagerRunner(Runner):
    """Each step computed in ``launch`` (every step is ready when fetched); no graphs, no device time."""

    def __init__(
        self,
        forward: ModelForward,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        backend: KernelBackend,
        device: torch.device,
        sampler: Sampler = sample,
        vocab_size: int = 0,  # the logits' width: the size of the per-row statistics (RowTokens)
    ) -> None:
        self.forward = forward
        self.sampler = sampler
        self.kv_caches = kv_caches
        self.backend = backend
        self.device = device
        self.vocab_size = vocab_size
        self.row_tokens: RowTokens | None = None  # made by the first step that reads them
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
        """The sampled rows' parameters, and the per-row statistics (their new rows built first)."""
        arrays = [self._tensor(getattr(inputs, name)) for name in SamplingTensors._fields[:-2]]
        if inputs.row_inits or inputs.features.stateful:
            self.row_tokens = ready_row_tokens(
                self.row_tokens, inputs.rows_capacity, self.vocab_size, self.device
            )
            if inputs.row_inits:
                self.row_tokens.init(inputs.row_inits)
        return SamplingTensors(*arrays, row_tokens=self.row_tokens)

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
        samples = len(inputs.logits_indices)
        kept, targets = with_prompt_rows(self._tensor(inputs.logits_indices), inputs)
        logits = self.forward(input_ids, self._tensor(inputs.positions), kept, self._context(inputs))
        prompt = (
            None if targets is None else score_prompt(full_vocab(self.sampler)(logits[samples:]), targets)
        )
        logits, params = logits[:samples], self._sampling(inputs)  # [S, V / K]
        if inputs.masked:
            self._prev = StepOutput(inputs.step_id, None, (logits.float(), params, inputs), prompt=prompt)
        else:
            self._prev = StepOutput(
                inputs.step_id, self.sampler(logits, params, inputs.features), prompt=prompt
            )
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
        handle.sampled = self.sampler(logits, params, inputs.features)
        handle.pending = handle.mask = None

    def reset(self) -> None:
        """Forget the previous step (after an abandoned stream: nothing may carry over from it)."""
        self._prev = None

    def fetch(self, out: StepOutput) -> StepResult:
        return step_result(out.step_id, out.sampled, out.prompt)
