"""Triton q/k prologue of attention: optional per-head RMSNorm (Qwen3), rotary embedding, KV write.

One program per token row of the fused qkv projection: it rotates the query heads in place and writes
the rotated keys and the values straight into their paged-cache slot, so q/k/v are never copied out of
the projection and the separate KV-write launch disappears. Rounding follows ``reference.rope_write_kv``
(transformers' order: each product rounded to the model dtype, then the sum). An FP8 cache gets
``k / k_scale`` and ``v / v_scale``, saturated and rounded to e4m3. A q|k|v product handed on as split-K
partials (``SplitSums``, FP8 at decode sizes) is added here, and q goes to a new tensor.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from batchgen.kernels.gemm.fp8_quant import exact_rounding, to_fp8
from batchgen.kernels.gemm.split_sums import SplitSums
from batchgen.kernels.gemm.split_sums_triton import load_product
from batchgen.kernels.launch.pdl import pdl_options, wait_for_producer


@triton.jit
def _norm_rotate(x1, x2, c, s, w_ptr, j, eps, QK_NORM: tl.constexpr, HALF: tl.constexpr):
    """Rotate [H, HALF] halves x1 | x2 by cos/sin [HALF] (after the per-head norm when QK_NORM)."""
    dt = x1.dtype
    if QK_NORM:
        a = x1.to(tl.float32)
        b = x2.to(tl.float32)
        rstd = tl.rsqrt((tl.sum(a * a, axis=1) + tl.sum(b * b, axis=1)) / (2 * HALF) + eps)[:, None]
        w1 = tl.load(w_ptr + j).to(tl.float32)[None, :]
        w2 = tl.load(w_ptr + HALF + j).to(tl.float32)[None, :]
        x1 = ((a * rstd).to(dt).to(tl.float32) * w1).to(dt)
        x2 = ((b * rstd).to(dt).to(tl.float32) * w2).to(dt)
    a = x1.to(tl.float32)
    b = x2.to(tl.float32)
    c = c[None, :]
    s = s[None, :]
    out1 = ((a * c).to(dt).to(tl.float32) - (b * s).to(dt).to(tl.float32)).to(dt)
    out2 = ((b * c).to(dt).to(tl.float32) + (a * s).to(dt).to(tl.float32)).to(dt)
    return out1, out2


@triton.jit
def _rope_kv_kernel(
    qkv_ptr,  # [T, (Hq + 2 * Hkv) * D], or with SPLITS > 1 [SPLITS, T, ...] fp32 partial products
    q_out_ptr,  # [T, >= Hq * D]: the rotated q (qkv itself: rotated in place)
    pos_ptr,  # [T] int64
    cos_ptr,  # [max_positions, HALF]
    sin_ptr,
    q_norm_ptr,  # [D], read when QK_NORM
    k_norm_ptr,
    k_cache_ptr,  # [num_blocks, block_size, Hkv, D]
    v_cache_ptr,
    slot_ptr,  # [T] int64, -1 = padding row: nothing written to the cache
    stride_t,
    stride_qo,
    stride_split,
    stride_cb,
    stride_co,
    stride_ch,
    block_size,
    eps,
    k_scale,
    v_scale,
    Q_HEADS: tl.constexpr,
    KV_HEADS: tl.constexpr,
    Q_PAD: tl.constexpr,
    KV_PAD: tl.constexpr,
    HALF: tl.constexpr,
    QK_NORM: tl.constexpr,
    FP8_CACHE: tl.constexpr,
    ROUND: tl.constexpr,
    SPLITS: tl.constexpr = 1,
    PDL: tl.constexpr = False,
):
    wait_for_producer(PDL)
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t)
    j = tl.arange(0, HALF)
    c = tl.load(cos_ptr + pos * HALF + j).to(tl.float32)
    s = tl.load(sin_ptr + pos * HALF + j).to(tl.float32)
    row = qkv_ptr + t * stride_t
    dt = q_out_ptr.dtype.element_ty

    hq = tl.arange(0, Q_PAD)[:, None]
    q_mask = (hq < Q_HEADS) & (j[None, :] < HALF)
    q_offs = hq * (2 * HALF) + j[None, :]
    q1 = load_product(row, q_offs, q_mask, stride_split, SPLITS, dt)
    q2 = load_product(row, q_offs + HALF, q_mask, stride_split, SPLITS, dt)
    q1, q2 = _norm_rotate(q1, q2, c, s, q_norm_ptr, j, eps, QK_NORM, HALF)
    q_row = q_out_ptr + t * stride_qo
    tl.store(q_row + q_offs, q1, mask=q_mask)
    tl.store(q_row + q_offs + HALF, q2, mask=q_mask)

    hk = tl.arange(0, KV_PAD)[:, None]
    kv_mask = (hk < KV_HEADS) & (j[None, :] < HALF)
    k_offs = Q_HEADS * 2 * HALF + hk * (2 * HALF) + j[None, :]
    v_offs = k_offs + KV_HEADS * 2 * HALF
    k1 = load_product(row, k_offs, kv_mask, stride_split, SPLITS, dt)
    k2 = load_product(row, k_offs + HALF, kv_mask, stride_split, SPLITS, dt)
    k1, k2 = _norm_rotate(k1, k2, c, s, k_norm_ptr, j, eps, QK_NORM, HALF)
    v1 = load_product(row, v_offs, kv_mask, stride_split, SPLITS, dt)
    v2 = load_product(row, v_offs + HALF, kv_mask, stride_split, SPLITS, dt)

    slot = tl.load(slot_ptr + t).to(tl.int64)  # int64: big caches overflow int32 offsets
    # A padding row is a fully masked store, which keeps the launch branch-free.
    w_mask = kv_mask & (hk < tl.where(slot >= 0, KV_HEADS, 0))
    slot = tl.maximum(slot, 0)
    dst = (slot // block_size) * stride_cb + (slot % block_size) * stride_co + hk * stride_ch + j[None, :]
    cache_dt = k_cache_ptr.dtype.element_ty
    if FP8_CACHE:
        k1 = to_fp8(k1.to(tl.float32) / k_scale, cache_dt, ROUND)
        k2 = to_fp8(k2.to(tl.float32) / k_scale, cache_dt, ROUND)
        v1 = to_fp8(v1.to(tl.float32) / v_scale, cache_dt, ROUND)
        v2 = to_fp8(v2.to(tl.float32) / v_scale, cache_dt, ROUND)
    tl.store(k_cache_ptr + dst, k1.to(cache_dt), mask=w_mask)
    tl.store(k_cache_ptr + dst + HALF, k2.to(cache_dt), mask=w_mask)
    tl.store(v_cache_ptr + dst, v1.to(cache_dt), mask=w_mask)
    tl.store(v_cache_ptr + dst + HALF, v2.to(cache_dt), mask=w_mask)


def rope_write_kv(
    qkv: torch.Tensor | SplitSums,  # [T, (Hq + 2 * Hkv) * D]
    positions: torch.Tensor,  # [T] int64
    cos: torch.Tensor,  # [max_positions, D / 2], model dtype, contiguous
    sin: torch.Tensor,
    q_norm: torch.Tensor | None,
    k_norm: torch.Tensor | None,
    eps: float,
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [T] int64
    q_heads: int,
    kv_heads: int,
    kv_scales: tuple[float, float] = (1.0, 1.0),  # used by an FP8 cache
) -> torch.Tensor:  # [T, Hq, D]
    """The rotated q: a view of qkv, rotated in place; of a new tensor when qkv comes as split-K
    partials (which the kernel adds)."""
    tokens, half = qkv.shape[0], cos.shape[-1]
    dim = 2 * half
    splits, split_stride, q_out = 1, 0, qkv
    if isinstance(qkv, SplitSums):
        dtype, splits, split_stride = qkv.dtype, qkv.partials.shape[0], qkv.partials.stride(0)
        qkv = qkv.partials[0]
        q_out = torch.empty((tokens, q_heads * dim), dtype=dtype, device=qkv.device)
    assert qkv.stride(-1) == 1 and qkv.shape[1] == (q_heads + 2 * kv_heads) * dim
    assert cos.is_contiguous() and sin.is_contiguous() and k_cache.stride() == v_cache.stride()
    assert half >= 8 and half & (half - 1) == 0, "head_dim must be a power of two >= 16"
    if tokens:
        norm = q_norm is not None
        _rope_kv_kernel[(tokens,)](
            qkv, q_out, positions, cos, sin, q_norm if norm else cos, k_norm if norm else cos,
            k_cache, v_cache, slot_mapping, qkv.stride(0), q_out.stride(0), split_stride,
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), k_cache.shape[1], eps, *kv_scales,
            Q_HEADS=q_heads, KV_HEADS=kv_heads, Q_PAD=triton.next_power_of_2(q_heads),
            KV_PAD=triton.next_power_of_2(kv_heads), HALF=half, QK_NORM=norm,
            FP8_CACHE=k_cache.dtype == torch.float8_e4m3fn, ROUND=exact_rounding(qkv), SPLITS=splits,
            num_warps=4 if q_heads * dim >= 2048 else 2,
            enable_fp_fusion=False,  # an FMA would skip rounding a * cos, unlike transformers
            **pdl_options(qkv),
        )  # fmt: skip
    return q_out[:, : q_heads * dim].view(tokens, q_heads, dim)
