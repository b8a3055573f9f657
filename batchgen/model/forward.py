"""The model forward a runner calls: batchgen's fused one where it applies, else transformers' own.

Both are ``forward(input_ids [T], positions [T], logits_indices [S], ctx: PagedContext) -> logits [S, V]``
over the packed tokens of one step; attention goes through the paged KV cache either way.
"""

from __future__ import annotations

import logging
from typing import Protocol

import torch

from batchgen.model.attention import PagedContext
from batchgen.model.fused import FusedForward, unsupported_reason

log = logging.getLogger(__name__)

MODEL_IMPLS = ("auto", "batchgen", "transformers")


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


def build_forward(model: torch.nn.Module, impl: str, max_positions: int) -> ModelForward:
    """``impl``: "batchgen" (fail when unsupported), "transformers", or "auto" (batchgen when it can)."""
    if impl not in MODEL_IMPLS:
        raise ValueError(f"unknown model implementation {impl!r} (one of {', '.join(MODEL_IMPLS)})")
    if impl == "transformers":
        return TransformersForward(model)
    reason = unsupported_reason(model)
    if reason is None:
        return FusedForward(model, max_positions)
    if impl == "batchgen":
        raise ValueError(f"--model-impl batchgen does not support this model: {reason}")
    log.info("running transformers' forward: batchgen's fused forward does not cover %s", reason)
    return TransformersForward(model)
