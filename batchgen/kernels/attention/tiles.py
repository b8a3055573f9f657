"""Triton device helpers shared by the decode and prefill kernels: paged KV tile loads, online softmax.

Scores live in the log2 domain (``qk_scale = scale * log2(e)``) so the kernels use ``exp2``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from batchgen.kernels.launch.device import needs_f32_dot


@triton.jit
def kv_rows(
    bt_row_ptr,  # this sequence's block-table row, int32
    offs,  # [N] token positions in the sequence
    valid,  # [N] bool, only read when MASKED
    kv_head,
    stride_cb,
    stride_co,
    stride_ch,
    BLOCK_SIZE: tl.constexpr,
    MASKED: tl.constexpr,
):
    """Element offsets [N] (int64) of tokens ``offs`` in the cache, through the block table; one lookup
    serves both the K and the V tile, and a tile may span several pages."""
    if MASKED:
        page = tl.load(bt_row_ptr + offs // BLOCK_SIZE, mask=valid, other=0)
    else:
        page = tl.load(bt_row_ptr + offs // BLOCK_SIZE)
    # int64 before the multiply: a large cache overflows int32 element offsets.
    return page.to(tl.int64) * stride_cb + (offs % BLOCK_SIZE) * stride_co + kv_head * stride_ch


@triton.jit
def load_rows(cache_ptr, rows, valid, d, MASKED: tl.constexpr):
    """The [N, D] tile at element offsets ``rows`` ([N]); masked rows read as 0."""
    if MASKED:
        return tl.load(cache_ptr + rows[:, None] + d[None, :], mask=valid[:, None], other=0.0)
    return tl.load(cache_ptr + rows[:, None] + d[None, :])


@triton.jit
def saturate_f16(x):
    """``x`` in fp16 for tiles read from an FP8 cache: a bf16 value past fp16's range (65504) saturates
    instead of becoming inf (and NaN scores)."""
    return tl.minimum(tl.maximum(x.to(tl.float32), -65504.0), 65504.0).to(tl.float16)


@triton.jit
def online_softmax_step(
    q,  # [M, D]
    k,  # [N, D]
    v,  # [N, D]
    acc,  # [M, D] fp32
    l_i,  # [M] fp32, running sum of exp2
    m_i,  # [M] fp32, running max of the scaled scores (log2 domain), -inf before any visible key
    mask,  # [M, N] bool, only read when MASKED
    qk_scale,
    MASKED: tl.constexpr,
    DOT_PREC: tl.constexpr,
    DOT_F32: tl.constexpr,
):
    if DOT_F32:  # interpreter only, see needs_f32_dot
        q = q.to(tl.float32)
        k = k.to(tl.float32)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC)  # [M, N] unscaled
    if MASKED:
        s = tl.where(mask, s, float("-inf"))
    # qk_scale > 0 commutes with max; scaling inside exp2's argument makes one FMA per score.
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    if MASKED:  # noqa: SIM108 (a constexpr branch, compiled out)
        # A row with no visible key yet keeps m = -inf; shift by 0 then so exp2 gives 0, not NaN.
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_use = m_new  # every row saw a finite score
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s * qk_scale - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    p = p.to(v.dtype)  # 16-bit P for the tensor cores, as flash attention does
    if DOT_F32:
        p = p.to(tl.float32)
        v = v.to(tl.float32)
    acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=DOT_PREC)
    return acc, l_i, m_new


def dot_precision(tensor: torch.Tensor) -> str:
    """fp32 inputs get exact ``ieee`` products (the GPU would otherwise use tf32); ignored for 16-bit."""
    return "ieee" if tensor.dtype == torch.float32 or needs_f32_dot(tensor) else "tf32"


def check_head_dim(head_dim: int) -> None:
    if head_dim < 16 or head_dim & (head_dim - 1):
        raise ValueError(f"head_dim must be a power of two >= 16, got {head_dim}")


def group_pad(group: int) -> int:
    """Rows of the decode q tile: the GQA group padded to a power of two and to tl.dot's minimum 16."""
    return max(16, triton.next_power_of_2(group))
