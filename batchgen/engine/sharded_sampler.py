"""Sampling over a vocabulary split across ranks. Every rank ends with the same tokens, so each keeps
its own carry-over of sampled tokens into the next step (no broadcast from rank 0).

Greedy steps reduce per rank: each sends its best (logit, token id) per row, [S, 2] instead of the
[S, V / K] logits. Steps that sample, want log-probabilities or read per-row statistics (penalties,
adjustments: every rank keeps the same, from the same step inputs) gather the whole logits and run the
one-process sampler on every rank (its noise is a function of row, step and token id: identical).
Steps with token masks (structured output) gather too: every rank holds the same masks (rank 0 sends
them with the step's sampling order), so every rank applies them alike.
"""

from __future__ import annotations

import torch

from batchgen.distributed.group import ParallelGroup
from batchgen.distributed.shard import Span
from batchgen.engine.sampler import SampleOutput, SamplingTensors, sample
from batchgen.engine.step_sampling import GREEDY, SamplingFeatures


class ShardedSampler:
    def __init__(self, group: ParallelGroup, vocab: Span, vocab_size: int) -> None:
        self.group, self.vocab, self.vocab_size = group, vocab, vocab_size
        self.width = -(-vocab_size // group.size)  # every rank's padded share

    def __call__(
        self, logits: torch.Tensor, params: SamplingTensors, features: SamplingFeatures
    ) -> SampleOutput:  # logits: [S, vocab.size], model dtype or float32
        if features != GREEDY or params.token_mask is not None:
            return sample(self._gather(logits.float()), params, features)
        return SampleOutput(self._greedy(logits))  # in the logits' dtype, as ``sample``'s greedy steps

    def full_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """This rank's share of some rows' logits [P, vocab.size] -> the whole vocabulary's [P, V] float32
        (every rank calls it: prompt log-probabilities)."""
        return self._gather(logits.float())

    def _greedy(self, logits: torch.Tensor) -> torch.Tensor:
        best, index = logits.max(dim=-1)  # [S]: the first maximum, like argmax
        # Token ids < 2**24 are exact in float32; ties go to the lowest rank, i.e. the lowest id.
        ids = (index + self.vocab.start).to(torch.float32)
        candidates = self.group.all_gather(torch.stack([best.float(), ids], dim=-1))  # [K, S, 2]
        rank = candidates[..., 0].argmax(dim=0, keepdim=True)  # [1, S]
        return candidates[..., 1].gather(0, rank).squeeze(0).to(torch.int64)

    def _gather(self, logits: torch.Tensor) -> torch.Tensor:  # -> [S, V]
        pad = self.width - logits.shape[1]
        if pad:
            logits = torch.nn.functional.pad(logits, (0, pad), value=float("-inf"))
        parts = self.group.all_gather(logits)  # [K, S, width]
        return parts.permute(1, 0, 2).reshape(logits.shape[0], -1)[:, : self.vocab_size]
