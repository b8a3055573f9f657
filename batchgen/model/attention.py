"""Paged attention behind transformers' AttentionInterface.

The model is called with ``batchgen=PagedContext(...)`` as a forward kwarg; transformers hands every
kwarg down to the attention function, so the step's metadata and the KV pool travel explicitly (no
module-level forward context). Registering an implementation name that has no mask function also makes
transformers skip building a dense causal mask.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from batchgen.model.backends import PagedContext

ATTN_IMPLEMENTATION = "batchgen_paged"


def paged_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,  # [1, q_heads, T, head_dim]
    key: torch.Tensor,  # [1, kv_heads, T, head_dim]
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    batchgen: PagedContext | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    if batchgen is None:
        raise RuntimeError("batchgen paged attention called without its context (batchgen=...)")
    unsupported = [k for k in ("softcap", "s_aux", "sinks") if kwargs.get(k) is not None]
    if unsupported:  # better a clear failure than silently different outputs
        raise NotImplementedError(f"this model's attention uses {', '.join(unsupported)}: not supported yet")
    ctx = batchgen
    k_cache, v_cache = ctx.kv_caches[module.layer_idx]
    q = query[0].transpose(0, 1)  # [T, q_heads, hd]
    ctx.backend.write_kv(k_cache, v_cache, key[0].transpose(0, 1), value[0].transpose(0, 1), ctx.slot_mapping)
    scale = scaling if scaling is not None else q.shape[-1] ** -0.5
    out = ctx.backend.attention(q, k_cache, v_cache, ctx, scale, sliding_window)  # [T, q_heads, hd]
    return out.unsqueeze(0), None


def register() -> str:
    """Register the paged attention function (idempotent) and return its implementation name."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention_forward)
    return ATTN_IMPLEMENTATION
