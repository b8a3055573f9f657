"""Paged attention behind transformers' AttentionInterface.

The model is called with ``batchgen=PagedContext(...)`` as a forward kwarg; transformers hands every
kwarg down to the attention function, so the step's metadata and the KV pool travel explicitly (no
module-level forward context). Registering an implementation name that has no mask function also makes
transformers skip building a dense causal mask.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch

from batchgen.kernels import reference

ATTN_IMPLEMENTATION = "batchgen_paged"


class AttentionBackend(Protocol):
    def write_kv(self, k_cache, v_cache, key, value, slot_mapping) -> None: ...

    def attention(
        self, query, k_cache, v_cache, ctx: PagedContext, scale: float, sliding_window
    ) -> torch.Tensor: ...


class PagedContext(NamedTuple):
    """Everything one forward pass needs to read and write the paged KV cache (device tensors)."""

    kv_caches: list[tuple[torch.Tensor, torch.Tensor]]  # per layer: [num_blocks, block_size, kv_heads, hd]
    slot_mapping: torch.Tensor  # [T] int64, -1 = padding
    cu_seqlens_q: torch.Tensor  # [B + 1] int32
    seq_lens: torch.Tensor  # [B] int32
    block_tables: torch.Tensor  # [B, max_blocks] int32
    max_q_len: int  # host-side bounds, fixed per CUDA-graph bucket
    max_seq_len: int
    backend: AttentionBackend


class TorchBackend:
    """The reference implementation (CPU path and oracle)."""

    def write_kv(self, k_cache, v_cache, key, value, slot_mapping) -> None:
        reference.write_kv(k_cache, v_cache, key, value, slot_mapping)

    def attention(self, query, k_cache, v_cache, ctx: PagedContext, scale: float, sliding_window):
        return reference.paged_attention(
            query, k_cache, v_cache, ctx.cu_seqlens_q, ctx.seq_lens, ctx.block_tables, scale, sliding_window
        )


class TritonBackend:
    """The CUDA path: Triton kernels, capturable in CUDA graphs (bounds come from the context)."""

    def __init__(self) -> None:
        from batchgen.kernels import dispatch

        self._kernels = dispatch

    def write_kv(self, k_cache, v_cache, key, value, slot_mapping) -> None:
        self._kernels.write_kv(k_cache, v_cache, key, value, slot_mapping)

    def attention(self, query, k_cache, v_cache, ctx: PagedContext, scale: float, sliding_window):
        return self._kernels.paged_attention_triton(
            query, k_cache, v_cache, ctx.cu_seqlens_q, ctx.seq_lens, ctx.block_tables, scale, sliding_window,
            decode_only=ctx.max_q_len == 1, max_seq_len=ctx.max_seq_len, max_q_len=ctx.max_q_len,
        )  # fmt: skip


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
