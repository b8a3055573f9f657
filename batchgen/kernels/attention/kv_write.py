"""Triton kernel that writes a step's new keys/values into their slots of the paged KV cache.

Same semantics as ``reference.write_kv``: row t goes to slot ``slot_mapping[t]`` (block
``slot // block_size``, offset ``slot % block_size``); rows with slot -1 (graph padding) write nothing.
One program per row writes all kv heads, so the launch has no host sync and no Python loop over requests.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _write_kv_kernel(
    key_ptr,  # [T, H, D]
    value_ptr,
    k_cache_ptr,  # [num_blocks, block_size, H, D]
    v_cache_ptr,
    slot_ptr,  # [T] int64
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cb,  # cache strides (k and v caches share them): block, offset, head
    stride_co,
    stride_ch,
    block_size,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEADS_PAD: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)  # int64: big caches overflow int32 offsets
    h = tl.arange(0, HEADS_PAD)[:, None]
    d = tl.arange(0, HEAD_DIM)[None, :]
    # A padding row (slot -1) is a fully masked store, which keeps the launch branch-free.
    mask = h < tl.where(slot >= 0, NUM_HEADS, 0)  # [HEADS_PAD, 1]
    blk = tl.maximum(slot, 0) // block_size
    off = tl.maximum(slot, 0) % block_size
    dst = blk * stride_cb + off * stride_co + h * stride_ch + d  # [HEADS_PAD, D]
    mask = mask & (d < HEAD_DIM)  # full [HEADS_PAD, D] mask
    k = tl.load(key_ptr + t * stride_kt + h * stride_kh + d, mask=mask)
    v = tl.load(value_ptr + t * stride_vt + h * stride_vh + d, mask=mask)
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv(
    k_cache: torch.Tensor,  # [num_blocks, block_size, kv_heads, head_dim]
    v_cache: torch.Tensor,
    key: torch.Tensor,  # [T, kv_heads, head_dim]
    value: torch.Tensor,
    slot_mapping: torch.Tensor,  # [T] int64, -1 = padding row, not written
) -> None:
    """Scatter ``key``/``value`` rows into the paged cache in place (CUDA-graph capturable)."""
    num_tokens, num_heads, head_dim = key.shape
    assert k_cache.shape == v_cache.shape and k_cache.stride() == v_cache.stride()
    assert k_cache.stride(-1) == 1 and head_dim == k_cache.shape[-1]
    assert head_dim >= 16 and head_dim & (head_dim - 1) == 0, "head_dim must be a power of two >= 16"
    if num_tokens == 0:
        return
    # Only the last dim has to be contiguous: q/k/v are often strided views of a fused projection.
    key = key if key.stride(-1) == 1 else key.contiguous()
    value = value if value.stride(-1) == 1 else value.contiguous()
    _write_kv_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        k_cache.shape[1],
        NUM_HEADS=num_heads, HEAD_DIM=head_dim, HEADS_PAD=triton.next_power_of_2(num_heads),
        num_warps=4 if num_heads * head_dim >= 1024 else 1,
    )  # fmt: skip
