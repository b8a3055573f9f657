"""The model forward a runner calls: batchgen's fused one (``model/fused.py``) where it applies, else
transformers' own (here); ``model/build.py`` picks. Both are
``forward(input_ids [T], positions [T], logits_indices [S], ctx: PagedContext) -> logits [S, V]`` over
the packed tokens of one step; attention goes through the paged KV cache either way.
"""

from __future__ import annotations

from typing import Protocol

import torch

from batchgen.model.backends import PagedContext


class ModelForward(Protocol):
    def __call__(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        logits_indices: torch.Tensor,  # [S]
        ctx: PagedContext,
    ) -> torch.Tensor: ...  # [S, V]


class TransformersForward:
    """transformers' modelling code, with batchgen's paged attention registered as its attention."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def __call__(self, input_ids, positions, logits_indices, ctx: PagedContext) -> torch.Tensor:
        out = self.model(
            input_ids=input_ids.unsqueeze(0),
            position_ids=positions.unsqueeze(0),
            logits_to_keep=logits_indices,
            use_cache=False,
            batchgen=ctx,
        )
        return out.logits[0]
