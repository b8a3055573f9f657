"""Triton kernels of the mixture-of-experts layer: token grouping, grouped GEMMs, the weighted combine.

``moe_experts(h, weights, ids, gate_up, down)`` computes, for every token t and each of its K routed
experts e_j with weight w_j, ``sum_j w_j * down[e_j] @ silu_mul(gate_up[e_j] @ h[t])``, in five launches:

1. ``_count_kernel``: tokens per expert (atomic adds into a zeroed [E] counter).
2. ``_place_kernel``: counting sort of the T * K (token, slot) pairs by expert: pair p goes to position
   ``start[e] + rank``, its rank within the expert from an atomic cursor (the order inside a group is
   free: every output row of a GEMM tile is computed alone, whatever its position in the tile).
3. ``_gate_up_kernel``: grouped GEMM over the sorted pairs, the tokens' rows gathered from ``h``,
   gate and up columns in two accumulators, SiLU-and-multiply in the epilogue: [P, I] in sorted order.
4. ``_down_kernel``: grouped GEMM [P, I] x down[e]^T, rows written back to pair order: [P, H].
5. ``_combine_kernel``: per token, the K rows times their routing weights, summed in fp32.

Tiles: each expert's group is cut into BLOCK_M-row tiles; a GEMM program finds its expert and rows from
the per-expert counts alone (a prefix sum over E values), so no padded index arrays are built. The grid
is the worst case, ``cdiv(P, BLOCK_M) + min(E, P)`` row tiles, known from Python ints: programs past the
last real tile exit at once. Nothing is read back to the host, so the layer is capturable in a CUDA graph.

Rounding follows transformers' grouped_mm experts: the projections rounded to the model dtype, SiLU
rounded then the product, the down projection rounded, times the routing weight (rounded to the model
dtype when the weights are in it, fp32 for Mixtral), the K products summed in fp32 and rounded once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from batchgen.kernels.launch.device import needs_f32_dot


@triton.jit
def _count_kernel(ids_ptr, counts_ptr, P, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < P
    e = tl.load(ids_ptr + offs, mask=mask, other=0)
    tl.atomic_add(counts_ptr + e, 1, mask=mask)


@triton.jit
def _place_kernel(ids_ptr, counts_ptr, cursor_ptr, order_ptr, P, E, BLOCK: tl.constexpr, E_PAD: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < P
    experts = tl.arange(0, E_PAD)
    counts = tl.load(counts_ptr + experts, mask=experts < E, other=0)
    starts = tl.cumsum(counts, 0) - counts  # [E_PAD] exclusive prefix: each expert's first sorted position
    e = tl.load(ids_ptr + offs, mask=mask, other=0)
    start = tl.sum(tl.where(experts[None, :] == e[:, None], starts[None, :], 0), axis=1)  # starts[e]
    rank = tl.atomic_add(cursor_ptr + e, 1, mask=mask)
    tl.store(order_ptr + start + rank, offs.to(tl.int32), mask=mask)


@triton.jit
def _tile_rows(counts_ptr, E, BLOCK_M: tl.constexpr, E_PAD: tl.constexpr):
    """This program's expert, its rows [BLOCK_M] in sorted order and their mask; expert -1 when the
    program's row tile lies past the last real one."""
    tile = tl.program_id(0)
    experts = tl.arange(0, E_PAD)
    counts = tl.load(counts_ptr + experts, mask=experts < E, other=0)
    tiles = (counts + BLOCK_M - 1) // BLOCK_M
    tile_end = tl.cumsum(tiles, 0)
    e = tl.sum((tile_end <= tile).to(tl.int32), axis=0)  # the first expert whose tiles reach past `tile`
    mine = experts == e
    first_tile = tl.sum(tl.where(mine, tile_end - tiles, 0), axis=0)
    count = tl.sum(tl.where(mine, counts, 0), axis=0)
    start = tl.sum(tl.where(mine, tl.cumsum(counts, 0) - counts, 0), axis=0)
    local = (tile - first_tile) * BLOCK_M + tl.arange(0, BLOCK_M)
    return tl.where(e < E, e, -1), start + local, local < count


@triton.jit
def _gate_up_kernel(
    x_ptr,  # [T, H] hidden states
    w_ptr,  # [E, 2I, H] gate rows then up rows of every expert
    counts_ptr,  # [E] int32
    order_ptr,  # [P] int32: pair index (token * K + slot) at each sorted position
    out_ptr,  # [P, I] in sorted order
    E,
    H,
    INTER,
    stride_x,
    stride_we,
    stride_wn,
    stride_o,
    TOP_K: tl.constexpr,
    E_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PREC: tl.constexpr,
    DOT_F32: tl.constexpr,
):
    e, rows, row_mask = _tile_rows(counts_ptr, E, BLOCK_M, E_PAD)
    if e < 0:
        return
    pairs = tl.load(order_ptr + rows, mask=row_mask, other=0)
    tokens = (pairs // TOP_K).to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, BLOCK_K)
    a_ptrs = x_ptr + tokens[:, None] * stride_x + k[None, :]
    g_ptrs = w_ptr + e.to(tl.int64) * stride_we + n[None, :].to(tl.int64) * stride_wn + k[:, None]  # [K, N]
    u_ptrs = g_ptrs + INTER * stride_wn
    n_mask = n[None, :] < INTER
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        k_in = k < H - k0
        a = tl.load(a_ptrs, mask=row_mask[:, None] & k_in[None, :], other=0.0)
        g = tl.load(g_ptrs, mask=k_in[:, None] & n_mask, other=0.0)
        u = tl.load(u_ptrs, mask=k_in[:, None] & n_mask, other=0.0)
        if DOT_F32:  # interpreter only, see needs_f32_dot
            a = a.to(tl.float32)
            g = g.to(tl.float32)
            u = u.to(tl.float32)
        acc_g = tl.dot(a, g, acc_g, input_precision=DOT_PREC)
        acc_u = tl.dot(a, u, acc_u, input_precision=DOT_PREC)
        a_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
        u_ptrs += BLOCK_K
    dt = out_ptr.dtype.element_ty
    gate = acc_g.to(dt).to(tl.float32)
    up = acc_u.to(dt).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(dt).to(tl.float32)
    o_ptrs = out_ptr + rows[:, None].to(tl.int64) * stride_o + n[None, :]
    tl.store(o_ptrs, (act * up).to(dt), mask=row_mask[:, None] & n_mask)


@triton.jit
def _down_kernel(
    a_ptr,  # [P, I] in sorted order
    w_ptr,  # [E, H, I]
    counts_ptr,
    order_ptr,
    y_ptr,  # [P, H] in pair order
    E,
    H,
    INTER,
    stride_a,
    stride_we,
    stride_wn,
    stride_y,
    E_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PREC: tl.constexpr,
    DOT_F32: tl.constexpr,
):
    e, rows, row_mask = _tile_rows(counts_ptr, E, BLOCK_M, E_PAD)
    if e < 0:
        return
    pairs = tl.load(order_ptr + rows, mask=row_mask, other=0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None].to(tl.int64) * stride_a + k[None, :]
    w_ptrs = w_ptr + e.to(tl.int64) * stride_we + n[None, :].to(tl.int64) * stride_wn + k[:, None]  # [K, N]
    n_mask = n[None, :] < H
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, INTER, BLOCK_K):
        k_in = k < INTER - k0
        a = tl.load(a_ptrs, mask=row_mask[:, None] & k_in[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=k_in[:, None] & n_mask, other=0.0)
        if DOT_F32:
            a = a.to(tl.float32)
            w = w.to(tl.float32)
        acc = tl.dot(a, w, acc, input_precision=DOT_PREC)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    y_ptrs = y_ptr + pairs[:, None].to(tl.int64) * stride_y + n[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=row_mask[:, None] & n_mask)


@triton.jit
def _combine_kernel(
    y_ptr,  # [T * K, H] expert outputs in pair order
    w_ptr,  # [T, K] routing weights (model dtype, or fp32)
    out_ptr,  # [T, H]
    H,
    stride_y,
    stride_o,
    TOP_K: tl.constexpr,
    ROUND_PRODUCT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < H
    dt = out_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for j in range(TOP_K):  # in slot order, as transformers' sum over the K axis
        y = tl.load(y_ptr + (t * TOP_K + j) * stride_y + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + t * TOP_K + j).to(tl.float32)
        p = y * w
        if ROUND_PRODUCT:  # weights in the model dtype: the product is a model-dtype tensor in transformers
            p = p.to(dt).to(tl.float32)
        acc += p
    tl.store(out_ptr + t * stride_o + cols, acc.to(dt), mask=mask)


def _config(pairs: int, experts: int, itemsize: int) -> dict:
    """Tile shapes by the mean rows per expert: decode-sized groups are weight-bandwidth bound (small
    BLOCK_M, long K tiles), prefill-sized ones compute bound (tensor-core-sized tiles). The shapes are
    sized for 2-byte data; fp32 halves BLOCK_K so the staged tiles still fit shared memory (a Hopper SM
    has 227 KiB: fp32 at BLOCK_M=128 with these stages asks 240 KiB)."""
    per_expert = -(-pairs // experts)
    if per_expert <= 16:
        cfg = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=4)
    elif per_expert <= 32:
        cfg = dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=4)
    elif per_expert <= 128:
        cfg = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=3)
    else:
        cfg = dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=64, num_warps=8, num_stages=3)
    if itemsize > 2:
        cfg["BLOCK_K"] //= 2
    return cfg


def group_by_expert(ids: torch.Tensor, experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(counts [E] int32, order [P] int32): the T * K pairs (``ids`` [T, K]) sorted by expert."""
    flat = ids.reshape(-1)
    pairs = flat.numel()
    counters = torch.zeros(2 * experts, dtype=torch.int32, device=ids.device)  # counts | cursors
    order = torch.empty(pairs, dtype=torch.int32, device=ids.device)
    if pairs:
        _count_kernel[(triton.cdiv(pairs, 256),)](flat, counters, pairs, BLOCK=256, num_warps=4)
        block = 64  # x E_PAD one-hot lanes to look up each pair's group start
        _place_kernel[(triton.cdiv(pairs, block),)](
            flat, counters, counters[experts:], order, pairs, experts,
            BLOCK=block, E_PAD=triton.next_power_of_2(experts), num_warps=4,
        )  # fmt: skip
    return counters[:experts], order


def moe_experts(
    h: torch.Tensor,  # [T, H]
    weights: torch.Tensor,  # [T, K] routing weights (model dtype, or fp32)
    ids: torch.Tensor,  # [T, K] expert ids
    gate_up: torch.Tensor,  # [E, 2I, H]
    down: torch.Tensor,  # [E, H, I]
) -> torch.Tensor:  # [T, H]
    assert h.stride(-1) == 1 and gate_up.stride(-1) == 1 and down.stride(-1) == 1
    tokens, hidden = h.shape
    top_k, experts, inter = ids.shape[1], gate_up.shape[0], down.shape[2]
    pairs = tokens * top_k
    out = torch.empty_like(h)
    if not pairs:
        return out
    counts, order = group_by_expert(ids, experts)
    cfg = _config(pairs, experts, h.element_size())
    max_tiles = triton.cdiv(pairs, cfg["BLOCK_M"]) + min(experts, pairs)  # the worst case, from ints
    prec = "ieee" if h.dtype == torch.float32 or needs_f32_dot(h) else "tf32"
    common = dict(E_PAD=triton.next_power_of_2(experts), DOT_PREC=prec, DOT_F32=needs_f32_dot(h), **cfg)
    act = torch.empty((pairs, inter), dtype=h.dtype, device=h.device)  # sorted order
    _gate_up_kernel[(max_tiles, triton.cdiv(inter, cfg["BLOCK_N"]))](
        h, gate_up, counts, order, act, experts, hidden, inter,
        h.stride(0), gate_up.stride(0), gate_up.stride(1), act.stride(0), TOP_K=top_k, **common,
    )  # fmt: skip
    y = torch.empty((pairs, hidden), dtype=h.dtype, device=h.device)  # pair order
    _down_kernel[(max_tiles, triton.cdiv(hidden, cfg["BLOCK_N"]))](
        act, down, counts, order, y, experts, hidden, inter,
        act.stride(0), down.stride(0), down.stride(1), y.stride(0), **common,
    )  # fmt: skip
    block = min(1024, triton.next_power_of_2(hidden))
    _combine_kernel[(tokens, triton.cdiv(hidden, block))](
        y, weights, out, hidden, y.stride(0), out.stride(0),
        TOP_K=top_k, ROUND_PRODUCT=weights.dtype != torch.float32, BLOCK=block, num_warps=4,
    )  # fmt: skip
    return out
