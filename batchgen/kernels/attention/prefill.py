"""Varlen (packed, chunked-prefill) paged attention: each sequence's new query rows attend to its earlier
cached tokens and causally to themselves. Mixed steps work too: a decode row is a chunk of length 1.

Layout. The q heads of one GQA group share a program, so each KV tile is loaded once for the group: a
sequence's q_len x GROUP (token, head) pairs are flattened into "virtual rows" ``vr = tok * GROUP + g``
and cut into tiles of BLOCK_M virtual rows. That needs no padding when GROUP is not a power of two.

Finding the sequence of a tile, on device. Sequence b's tiles start at tile ``cu_q[b] * GROUP // BLOCK_M + b``
(monotone in b; it gives b at least cdiv(q_len * GROUP, BLOCK_M) tiles, the spare one exits at once).
Each program loads cu_seqlens_q (B + 1 ints) and counts the starts <= its tile id. The grid,
``cdiv(T * GROUP, BLOCK_M) + B`` x kv_heads, depends only on shapes, so there is no host sync and no
``q_seq_ids`` argument to precompute.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from batchgen.kernels.attention.tiles import (
    check_head_dim,
    dot_precision,
    kv_rows,
    load_rows,
    saturate_f16,
)
from batchgen.kernels.attention.tiles import online_softmax_step as _step
from batchgen.kernels.launch.device import needs_f32_dot

LOG2E = 1.4426950408889634
# ``_find_tile``'s lanes over the step's sequences: one variant for every step of up to 511 sequences.
# A power of two per step (16..512 sequences: 6 variants) meant a compile for each new size met, inside
# a fresh machine's run; the extra lanes are one L2-resident load a program.
MIN_SEQS_PAD = 512


@triton.jit
def _find_tile(cu_q_ptr, tile, num_seqs, GROUP: tl.constexpr, BLOCK_M: tl.constexpr, SEQS_PAD: tl.constexpr):
    """(sequence index, tile index within it) of packed tile ``tile``; index num_seqs when past the end."""
    idx = tl.arange(0, SEQS_PAD)
    cu = tl.load(cu_q_ptr + idx, mask=idx <= num_seqs, other=0)
    starts = tl.where(idx <= num_seqs, cu * GROUP // BLOCK_M + idx, 2147483647)  # [SEQS_PAD]
    b = tl.sum((starts <= tile).to(tl.int32), 0) - 1
    local = tile - (tl.load(cu_q_ptr + b) * GROUP // BLOCK_M + b)
    return b, local


# The sequence and tile counts change with every eager step: specializing on them (== 1, divisible by 16)
# would compile up to 4 variants of the kernel (each a first-use cost per process, a compile on a fresh
# machine) for no faster code: they only bound loops and masks.
@triton.jit(do_not_specialize=["num_seqs", "num_tiles"])
def _prefill_kernel(
    q_ptr,  # [T, Hq, D]
    k_ptr,  # [num_blocks, block_size, Hkv, D]
    v_ptr,
    out_ptr,  # [T, Hq, D]
    cu_q_ptr,  # [B + 1] int32
    seq_lens_ptr,  # [B] int32
    bt_ptr,  # [B, max_blocks] int32
    qk_scale,  # softmax scale * log2(e) * k_scale (an FP8 cache's keys are q * k_scale)
    v_scale,  # an FP8 cache's values are q * v_scale (1.0 otherwise)
    window,
    num_seqs,
    num_tiles,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_cb,
    stride_co,
    stride_ch,
    stride_bt,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    SEQS_PAD: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    DOT_PREC: tl.constexpr,
    DOT_F32: tl.constexpr,
    KV_F16: tl.constexpr = False,  # an FP8 cache: tiles (and q) in fp16, the e4m3 -> fp16 convert is native
):
    # Last tiles first: within a sequence they see the most keys, so the long programs start early.
    tile = num_tiles - 1 - tl.program_id(0)
    kv_head = tl.program_id(1)
    b, local = _find_tile(cu_q_ptr, tile, num_seqs, GROUP, BLOCK_M, SEQS_PAD)
    if b >= num_seqs:
        return
    q_start = tl.load(cu_q_ptr + b)
    q_len = tl.load(cu_q_ptr + b + 1) - q_start
    if local * BLOCK_M >= q_len * GROUP:
        return
    ctx = tl.load(seq_lens_ptr + b) - q_len  # tokens cached before this chunk

    vr = local * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] virtual rows (tok, g)
    tok = vr // GROUP
    row_ok = vr < q_len * GROUP
    d = tl.arange(0, HEAD_DIM)
    q_rows = (q_start + tok) * stride_qt + (kv_head * GROUP + vr % GROUP) * stride_qh  # [BLOCK_M]
    q = tl.load(q_ptr + q_rows[:, None] + d[None, :], mask=row_ok[:, None], other=0.0)
    if KV_F16:
        q = saturate_f16(q)
    q_pos = ctx + tok  # [BLOCK_M]

    tok_lo = local * BLOCK_M // GROUP
    tok_hi = tl.minimum(q_len - 1, (local * BLOCK_M + BLOCK_M - 1) // GROUP)
    kv_hi = ctx + tok_hi + 1  # keys past the tile's last query are invisible to all its rows
    bt_row = bt_ptr + b.to(tl.int64) * stride_bt
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    if USE_WINDOW:
        kv_lo = tl.maximum(ctx + tok_lo - window + 1, 0)
        full_hi = kv_lo  # every tile needs the window mask
    else:
        kv_lo = 0
        full_hi = (ctx + tok_lo + 1) // BLOCK_N * BLOCK_N  # keys below are visible to every row
    for start in range(kv_lo, full_hi, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        rows = kv_rows(bt_row, offs, offs, kv_head, stride_cb, stride_co, stride_ch, BLOCK_SIZE, False)
        k = load_rows(k_ptr, rows, offs, d, False).to(q.dtype)  # [BLOCK_N, D]
        v = load_rows(v_ptr, rows, offs, d, False).to(q.dtype)
        acc, l_i, m_i = _step(q, k, v, acc, l_i, m_i, q, qk_scale, False, DOT_PREC, DOT_F32)
    for start in range(full_hi, kv_hi, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        valid = offs < kv_hi
        rows = kv_rows(bt_row, offs, valid, kv_head, stride_cb, stride_co, stride_ch, BLOCK_SIZE, True)
        k = load_rows(k_ptr, rows, valid, d, True).to(q.dtype)  # [BLOCK_N, D]
        v = load_rows(v_ptr, rows, valid, d, True).to(q.dtype)
        mask = valid[None, :] & (offs[None, :] <= q_pos[:, None])  # [BLOCK_M, BLOCK_N]
        if USE_WINDOW:
            mask &= offs[None, :] > q_pos[:, None] - window
        acc, l_i, m_i = _step(q, k, v, acc, l_i, m_i, mask, qk_scale, True, DOT_PREC, DOT_F32)

    out = acc * (v_scale / tl.where(l_i > 0, l_i, 1.0))[:, None]
    o_rows = (q_start + tok) * stride_ot + (kv_head * GROUP + vr % GROUP) * stride_oh
    tl.store(out_ptr + o_rows[:, None] + d[None, :], out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


def default_prefill_config(head_dim: int, dtype: torch.dtype, block_m: int | None = None) -> dict:
    """Tile sizes and launch knobs. 16-bit with head_dim <= 128: 128 x 64 tiles, 3 stages (~128 KiB of
    shared memory). fp32 or wider heads double the bytes per row: smaller tiles and 2 stages fit 227 KiB."""
    small = dtype == torch.float32 or head_dim > 128
    if small:
        return dict(block_m=block_m or 64, block_n=32, num_warps=4, num_stages=2)
    if block_m == 64:  # short chunks (see dispatch)
        return dict(block_m=64, block_n=64, num_warps=4, num_stages=3)
    return dict(block_m=128, block_n=128, num_warps=8, num_stages=3)  # best of the tile sweep


def prefill_attention(
    query: torch.Tensor,  # [T, Hq, D] packed chunks (+ padding rows)
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,  # [B + 1] int32
    seq_lens: torch.Tensor,  # [B] int32
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    scale: float,
    sliding_window: int | None = None,
    *,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    out: torch.Tensor | None = None,
    kv_scales: tuple[float, float] = (1.0, 1.0),
    kv_f16: bool | None = None,
) -> torch.Tensor:  # [T, Hq, D]; padding rows are left as they were in ``out``
    num_tokens, q_heads, head_dim = query.shape
    batch = seq_lens.shape[0]
    kv_heads = k_cache.shape[2]
    check_head_dim(head_dim)
    assert q_heads % kv_heads == 0 and k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1
    cfg = default_prefill_config(head_dim, query.dtype, block_m)
    given = dict(block_n=block_n, num_warps=num_warps, num_stages=num_stages)
    cfg.update({key: val for key, val in given.items() if val is not None})
    query = query if query.stride(-1) == 1 else query.contiguous()
    block_tables = block_tables if block_tables.stride(-1) == 1 else block_tables.contiguous()
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device) if out is None else out
    if batch == 0 or num_tokens == 0:
        return out
    group = q_heads // kv_heads
    if kv_f16 is None:
        # An FP8 cache's tiles go to fp16 (one native convert; bf16 takes three), as in decode_attention.
        kv_f16 = k_cache.element_size() == 1 and query.dtype == torch.bfloat16
    num_tiles = triton.cdiv(num_tokens * group, cfg["block_m"]) + batch
    _prefill_kernel[(num_tiles, kv_heads)](
        query, k_cache, v_cache, out, cu_seqlens_q, seq_lens, block_tables,
        scale * LOG2E * kv_scales[0], kv_scales[1], sliding_window or 0, batch, num_tiles,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_M=cfg["block_m"], BLOCK_N=cfg["block_n"],
        BLOCK_SIZE=k_cache.shape[1], SEQS_PAD=max(MIN_SEQS_PAD, triton.next_power_of_2(batch + 1)),
        USE_WINDOW=sliding_window is not None, DOT_PREC=dot_precision(query), DOT_F32=needs_f32_dot(query),
        KV_F16=kv_f16, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )  # fmt: skip
    return out
