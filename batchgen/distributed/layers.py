"""Sharded layers. Column-parallel projections need no wrapper (a rank simply holds some output rows);
these are the layers whose ranks must combine their results.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.nn.functional as F

from batchgen.distributed.group import ParallelGroup
from batchgen.distributed.shard import Span
from batchgen.kernels.cpu import cpu_linear


class Projection(Protocol):
    """What a sharded layer needs of the projection it wraps (the model's weight formats provide it;
    named here so this floor imports nothing of the model)."""

    out_features: int
    act_quant: Any

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


class RowParallel:
    """A projection whose input features are split over ranks: partial products, then one all-reduce.
    The bias (if any) lives on rank 0 only, so it is added once."""

    def __init__(self, local: Projection, group: ParallelGroup) -> None:
        self.local, self.group = local, group
        self.out_features = local.out_features
        self.act_quant = local.act_quant  # an FP8 input is quantized over the rank's shard of its features

    def __call__(self, x: torch.Tensor, summed: bool = True) -> torch.Tensor:  # [T, in / K] -> [T, out]
        return self.group.all_reduce(self.local(x))  # always summed: the all-reduce takes a tensor


class VocabEmbedding:
    """Token embeddings of the rank's vocabulary range; other ranks' tokens give zero rows, and the
    all-reduce fills them in (exact: each row is a sum of one vector and zeros)."""

    def __init__(self, weight: torch.Tensor, vocab: Span, group: ParallelGroup) -> None:
        self.weight, self.vocab, self.group = weight, vocab, group  # weight: [vocab.size, H]

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, H]
        if not self.group.is_parallel:
            return F.embedding(ids, self.weight)
        local = ids - self.vocab.start
        inside = (local >= 0) & (local < self.vocab.size)
        out = F.embedding(local.clamp(0, self.vocab.size - 1), self.weight)
        return self.group.all_reduce(out.masked_fill_(~inside.unsqueeze(1), 0))


class LMHead:
    """Logits of the rank's vocabulary range: [S, H] -> [S, vocab.size]. Sampling combines the ranks."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, vocab: Span) -> None:
        self.weight, self.bias, self.vocab = weight, bias, vocab

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        return cpu_linear.linear(hidden, self.weight, self.bias)
