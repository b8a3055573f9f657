"""Split-K (flash-decoding) paged attention for decode steps: one query row per sequence.

Grid (sequence, kv_head, split). A program loads each KV tile of its split once and multiplies it with
the query rows of all q heads of its GQA group at once (the group padded to >= 16 rows for tl.dot).
Each split writes its normalised partial output and log-sum-exp; a small second kernel merges the splits.
The split count derives from Python ints (batch, heads, the caller's ``max_seq_len`` bound), never from
device values, so the launch is CUDA-graph capturable; each sequence divides its own context evenly
among the splits (in whole tiles), so a graph captured for the longest context stays balanced at any.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from batchgen.kernels.attention import fp8_decode_cuda
from batchgen.kernels.attention.tiles import (
    check_head_dim,
    dot_precision,
    group_pad,
    kv_rows,
    load_rows,
    saturate_f16,
)
from batchgen.kernels.attention.tiles import online_softmax_step as _step
from batchgen.kernels.launch.device import needs_f32_dot, num_sms
from batchgen.kernels.launch.pdl import pdl_options, wait_for_producer

LOG2E = 1.4426950408889634
# Fewer tokens per split than this and the merge costs more than the extra parallelism gains.
MIN_SPLIT_TOKENS = 256


# The split count is a runtime argument: it follows the batch (``choose_num_splits``), and a constexpr
# would compile one kernel per count met (a drained batch's tail meets ~8: a compile each on a fresh
# machine, inside the run). Only whether the step splits at all is compiled in.
@triton.jit(do_not_specialize=["num_splits"])
def _decode_split_kernel(
    q_ptr,  # [T, Hq, D]
    k_ptr,  # [num_blocks, block_size, Hkv, D]
    v_ptr,
    out_ptr,  # [T, Hq, D], written directly when not SPLIT
    part_acc_ptr,  # [B, Hq, num_splits, D] fp32
    part_lse_ptr,  # [B, Hq, num_splits] fp32, log2 domain
    cu_q_ptr,  # [B + 1] int32
    seq_lens_ptr,  # [B] int32
    bt_ptr,  # [B, max_blocks] int32
    qk_scale,  # softmax scale * log2(e) * k_scale (an FP8 cache's keys are q * k_scale)
    v_scale,  # an FP8 cache's values are q * v_scale (1.0 otherwise)
    window,
    num_splits,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_cb,
    stride_co,
    stride_ch,
    stride_bt,
    NUM_Q_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    SPLIT: tl.constexpr,  # num_splits > 1: partials for the merge kernel, else the output itself
    USE_WINDOW: tl.constexpr,
    DOT_PREC: tl.constexpr,
    DOT_F32: tl.constexpr,
    KV_F16: tl.constexpr = False,  # an FP8 cache: tiles (and q) in fp16, the e4m3 -> fp16 convert is native
    PDL: tl.constexpr = False,
):
    wait_for_producer(PDL)
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    row = tl.load(cu_q_ptr + b)
    q_len = tl.load(cu_q_ptr + b + 1) - row
    # A padding sequence (no query row) attends to nothing.
    seq_len = tl.where(q_len > 0, tl.load(seq_lens_ptr + b), 0)

    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + g  # [GROUP_PAD]
    q = tl.load(q_ptr + row * stride_qt + heads[:, None] * stride_qh + d[None, :], mask=g[:, None] < GROUP)
    if KV_F16:
        q = saturate_f16(q)

    split_tokens = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N  # this sequence's share
    lo = split * split_tokens
    hi = tl.minimum(lo + split_tokens, seq_len)
    if USE_WINDOW:
        lo = tl.maximum(lo, seq_len - window)  # decode query sits at seq_len - 1
    bt_row = bt_ptr + b.to(tl.int64) * stride_bt

    acc = tl.zeros([GROUP_PAD, HEAD_DIM], dtype=tl.float32)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    for start in range(lo, hi, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        valid = offs < hi
        rows = kv_rows(bt_row, offs, valid, kv_head, stride_cb, stride_co, stride_ch, BLOCK_SIZE, True)
        k = load_rows(k_ptr, rows, valid, d, True).to(q.dtype)  # [BLOCK_N, D]
        v = load_rows(v_ptr, rows, valid, d, True).to(q.dtype)
        acc, l_i, m_i = _step(q, k, v, acc, l_i, m_i, valid[None, :], qk_scale, True, DOT_PREC, DOT_F32)

    has_keys = l_i > 0
    out = acc * (v_scale / tl.where(has_keys, l_i, 1.0))[:, None]  # [GROUP_PAD, D]; an empty split: zeros
    row_mask = g[:, None] < GROUP
    if not SPLIT:
        o_ptrs = out_ptr + row * stride_ot + heads[:, None] * stride_oh + d[None, :]
        # Scalar conditions go through tl.where: the interpreter rejects scalar & vector mask mixes.
        tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=g[:, None] < tl.where(q_len > 0, GROUP, 0))
    else:
        part = (b * NUM_Q_HEADS + heads) * num_splits + split  # [GROUP_PAD]
        tl.store(part_acc_ptr + part[:, None] * HEAD_DIM + d[None, :], out, mask=row_mask)
        lse = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
        tl.store(part_lse_ptr + part, lse, mask=g < GROUP)


@triton.jit(do_not_specialize=["num_splits"])
def _decode_merge_kernel(
    out_ptr,  # [T, Hq, D]
    part_acc_ptr,  # [B, Hq, num_splits, D] fp32
    part_lse_ptr,  # [B, Hq, num_splits] fp32
    cu_q_ptr,
    stride_ot,
    stride_oh,
    num_splits,
    NUM_Q_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    SPLITS_PAD: tl.constexpr,  # num_splits' power of two: split counts 5-8 share a variant, ...
    PDL: tl.constexpr = False,
):
    wait_for_producer(PDL)
    b = tl.program_id(0)
    head = tl.program_id(1)
    row = tl.load(cu_q_ptr + b)
    q_len = tl.load(cu_q_ptr + b + 1) - row
    s = tl.arange(0, SPLITS_PAD)
    d = tl.arange(0, HEAD_DIM)
    base = (b * NUM_Q_HEADS + head) * num_splits
    lse = tl.load(part_lse_ptr + base + s, mask=s < num_splits, other=float("-inf"))  # [SPLITS_PAD]
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)  # no keys at all (empty sequence): weights are all 0
    w = tl.exp2(lse - m)
    acc = tl.load(
        part_acc_ptr + (base + s[:, None]) * HEAD_DIM + d[None, :], mask=s[:, None] < num_splits, other=0.0
    )
    total = tl.sum(w, 0)
    out = tl.sum(acc * w[:, None], 0) / tl.where(total > 0, total, 1.0)  # [D]
    o_ptrs = out_ptr + row * stride_ot + head * stride_oh + d
    # Scalar conditions go through tl.where: the interpreter rejects scalar & vector mask mixes.
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=d < tl.where(q_len > 0, HEAD_DIM, 0))


def choose_num_splits(batch: int, kv_heads: int, max_seq_len: int, sms: int, waves: int = 2) -> int:
    """Splits so that batch * kv_heads * splits covers ``waves`` programs per SM; Python ints only.

    Two waves: a partial last wave (as with 3) leaves SMs idle while it finishes, so a bf16 decode read
    its KV closer to copy bandwidth at 2; the FP8 kernel (2 programs per SM, by registers) is fastest at
    2 too (docs/results.md)."""
    max_useful = max(1, math.ceil(max_seq_len / MIN_SPLIT_TOKENS))
    wanted = math.ceil(waves * sms / max(1, batch * kv_heads))
    return max(1, min(wanted, max_useful))


class TritonTiles(NamedTuple):
    """The Triton kernel's launch choices; None picks the default for the step's dtypes."""

    block_n: int | None = None
    num_warps: int = 4
    num_stages: int | None = None
    kv_f16: bool | None = None  # an FP8 cache's tiles (and q) converted to fp16

    def resolve(self, query: torch.Tensor, k_cache: torch.Tensor) -> TritonTiles:
        fp8_cache = k_cache.element_size() == 1
        block_n = self.block_n
        if block_n is None:
            # 64 tokens of K and V per stage (32 KiB at bf16/D=128); wider rows halve it to fit 3 stages in
            # smem. An FP8 cache holds 128 tokens in those bytes, and was faster at 128 than at 64.
            block_n = 64 if query.shape[-1] * query.element_size() <= 256 else 32
            block_n = 2 * block_n if fp8_cache else block_n
        # An FP8 cache's tiles go to fp16 (one native convert; bf16 takes three) and q with them, which is
        # faster. q's magnitudes stay far inside fp16's range (~6.5e4) in the models served.
        kv_f16 = fp8_cache and query.dtype == torch.bfloat16 if self.kv_f16 is None else self.kv_f16
        # The page lookup and the K/V tile it addresses are a chain of two loads, so Triton's pipeliner keeps
        # (num_stages - 1) // 2 tiles in flight: 3 stages keep one. An FP8 program holds ~200 registers (2 per
        # SM), too few loads in flight with one tile: 5 stages (two tiles) run faster at decode shapes; bf16
        # (4-5 programs per SM) is fastest at 3 (``docs/kernels.md``).
        num_stages = (5 if fp8_cache else 3) if self.num_stages is None else self.num_stages
        return TritonTiles(block_n, self.num_warps, num_stages, kv_f16)


def decode_attention(
    query: torch.Tensor,  # [T, Hq, D], one row per sequence (+ padding rows)
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,  # [B + 1] int32
    seq_lens: torch.Tensor,  # [B] int32
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    scale: float,
    sliding_window: int | None = None,
    *,
    max_seq_len: int,
    num_splits: int | None = None,
    block_n: int | None = None,
    num_warps: int = 4,
    num_stages: int | None = None,
    out: torch.Tensor | None = None,
    kv_scales: tuple[float, float] = (1.0, 1.0),
    kv_f16: bool | None = None,
    cuda_shape: fp8_decode_cuda.LaunchShape | None = None,
) -> torch.Tensor:  # [T, Hq, D]; rows with no sequence are left as they were in ``out``
    """``cuda_shape``: forces the CUDA FP8 kernel with that launch shape (it runs by default where it
    applies: ``fp8_decode_cuda.supports``); tile arguments force the Triton kernel."""
    num_tokens, q_heads, head_dim = query.shape
    batch = seq_lens.shape[0]
    kv_heads = k_cache.shape[2]
    check_head_dim(head_dim)
    assert q_heads % kv_heads == 0 and k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1
    triton_tiles = TritonTiles(block_n, num_warps, num_stages, kv_f16)
    default_tiles = cuda_shape is None and triton_tiles == TritonTiles()
    cuda_default = default_tiles and fp8_decode_cuda.supports(query, k_cache, v_cache, sliding_window)
    if num_splits is None:
        # Triton: 2 programs per SM (its FP8 and bf16 tiles fit 2). The CUDA kernel splits only below one
        # program per SM: with one program per SM or more, splitting only adds the merge's work, with TMA
        # copies and with cp.async alike.
        waves = 1 if cuda_default or cuda_shape is not None else 2
        num_splits = choose_num_splits(batch, kv_heads, max_seq_len, num_sms(query.device), waves)
    if cuda_default:
        cuda_shape = fp8_decode_cuda.default_shape(query, batch * kv_heads * num_splits)
    query = query if query.stride(-1) == 1 else query.contiguous()
    block_tables = block_tables if block_tables.stride(-1) == 1 else block_tables.contiguous()
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device) if out is None else out
    if batch == 0:
        return out
    part_acc = torch.empty((batch, q_heads, num_splits, head_dim), dtype=torch.float32, device=query.device)
    part_lse = torch.empty((batch, q_heads, num_splits), dtype=torch.float32, device=query.device)
    qk_scale = scale * LOG2E * kv_scales[0]
    if cuda_shape is not None:
        fp8_decode_cuda.launch(
            query, k_cache, v_cache, out, part_acc, part_lse, cu_seqlens_q, seq_lens, block_tables,
            qk_scale, kv_scales[1], num_splits, cuda_shape,
        )  # fmt: skip
    else:
        tiles = triton_tiles.resolve(query, k_cache)
        _decode_split_kernel[(batch, kv_heads, num_splits)](
            query, k_cache, v_cache, out, part_acc, part_lse, cu_seqlens_q, seq_lens, block_tables,
            qk_scale, kv_scales[1], sliding_window or 0, num_splits,
            query.stride(0), query.stride(1), out.stride(0), out.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
            NUM_Q_HEADS=q_heads, GROUP=q_heads // kv_heads, GROUP_PAD=group_pad(q_heads // kv_heads),
            HEAD_DIM=head_dim, BLOCK_N=tiles.block_n, BLOCK_SIZE=k_cache.shape[1], SPLIT=num_splits > 1,
            USE_WINDOW=sliding_window is not None, DOT_PREC=dot_precision(query),
            DOT_F32=needs_f32_dot(query), KV_F16=tiles.kv_f16, num_warps=tiles.num_warps,
            num_stages=tiles.num_stages, **pdl_options(query),
        )  # fmt: skip
    if num_splits > 1:
        _decode_merge_kernel[(batch, q_heads)](
            out, part_acc, part_lse, cu_seqlens_q, out.stride(0), out.stride(1), num_splits,
            NUM_Q_HEADS=q_heads, HEAD_DIM=head_dim,
            SPLITS_PAD=triton.next_power_of_2(num_splits), num_warps=1 if head_dim <= 64 else 2,
            **pdl_options(out),
        )  # fmt: skip
    return out
