"""Triton kernels of the mixture-of-experts layer: grouped GEMMs and the weighted combine.

``moe_experts(h, weights, ids, gate_up, down)`` computes, for every token t and each of its K routed
experts e_j with weight w_j, ``sum_j w_j * down[e_j] @ silu_mul(gate_up[e_j] @ h[t])``, in five launches:

1-2. ``group_by_expert`` (``grouping.py``): tokens per expert, then a counting sort of the T * K
   (token, slot) pairs by expert (the order inside a group is free: every output row of a GEMM tile is
   computed alone, whatever its position in the tile).
3. ``_gate_up_kernel``: grouped GEMM over the sorted pairs, the tokens' rows gathered from ``h``,
   gate and up columns in two accumulators, SiLU-and-multiply in the epilogue: [P, I] in sorted order.
4. ``_down_kernel``: grouped GEMM [P, I] x down[e]^T, rows written back to pair order: [P, H].
5. ``_combine_kernel``: per token, the K rows times their routing weights, summed in fp32.

Tiles: each expert's group is cut into BLOCK_M-row tiles; a GEMM program finds its expert and rows from
the per-expert counts alone (a prefix sum over E values), so no padded index arrays are built. The grid
is the worst case, ``cdiv(P, BLOCK_M) + min(E, P)`` row tiles, known from Python ints: programs past the
last real tile exit at once. Nothing is read back to the host, so the layer is capturable in a CUDA graph.

FP8 weights (``Fp8Experts``, ``expert_format.py``): weight-only by default (the activations stay 16-bit),
each e4m3 tile converted to the activations' dtype before its product; with ``act_fp8`` (W8A8) each
product's input is quantized first (``product_input``: a scale per row, or per the weight blocks' columns)
and the tiles multiply as e4m3, the activations' scales joining the weights' on the fp32 sums.
Per-channel scales multiply the fp32 sums after the K loop (before SiLU, before the store); block scales
multiply each K tile's partial product (a tile never straddles a block column: BLOCK_K divides the
block's columns and the columns of the first block before a rank's share, ``Fp8Experts.offset``). A
constexpr ``SCALES`` picks the path: 0, the 16/32-bit weights, compiles the kernels exactly as without
FP8. Tile shapes: ``tiles.py``.

Rounding follows transformers' grouped_mm experts: the projections rounded to the model dtype, SiLU
rounded then the product, the down projection rounded, times the routing weight (rounded to the model
dtype when the weights are in it, fp32 for Mixtral), the K products summed in fp32 and rounded once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from batchgen.kernels.fp8_format import ActQuant
from batchgen.kernels.gemm.fp8_quant import quantize_act
from batchgen.kernels.launch.device import needs_f32_dot
from batchgen.kernels.moe.expert_format import Fp8Experts, act_group
from batchgen.kernels.moe.grouping import group_by_expert, program_tiles, tile_rows
from batchgen.kernels.moe.tiles import Weights, kernel_tiles, tile_config, weight_of

__all__ = ["combine_into", "down_into", "gate_up_into", "kernel_tiles", "moe_experts", "product_input",
           "tile_config"]  # fmt: skip


@triton.jit
def _scale_ptrs(s_ptr, e, n, stride_se, stride_sn, first_row, row0, SCALE_N: tl.constexpr):
    """[BLOCK_N] pointers to the scales of output columns ``n`` of expert ``e`` (K block 0): per channel
    (SCALE_N 1) or per block row, from the scale row ``first_row`` of the columns' part (gate or up),
    whose first block starts ``row0`` rows before the part."""
    return s_ptr + e.to(tl.int64) * stride_se + (first_row + (row0 + n) // SCALE_N).to(tl.int64) * stride_sn


@triton.jit
def _dot(a, b, acc, DOT_PREC: tl.constexpr, ACT_FP8: tl.constexpr):
    """acc + a [M, K] x b [K, N] in fp32; e4m3 x e4m3 where ACT_FP8 (the precision names 16/32-bit inputs)."""
    if ACT_FP8:
        return tl.dot(a, b, acc)
    return tl.dot(a, b, acc, input_precision=DOT_PREC)


# The row tiles change with every step's token count: specializing on them (== 1, divisible by 16) would
# compile more variants of each kernel for no faster code (they only order the programs).
@triton.jit(do_not_specialize=["row_tiles"])
def _gate_up_kernel(
    x_ptr,  # [T, H] hidden states
    w_ptr,  # [E, 2I, H] gate rows then up rows of every expert (model dtype, or e4m3 when SCALES)
    s_ptr,  # SCALES 1: [E, 2I] fp32; SCALES 2: [E, 2 * cdiv(I, SCALE_N), cdiv(H, SCALE_K)]; else unused
    xs_ptr,  # ACT_FP8: the hidden states' scales, [T, 1] per token or [T, cdiv(H, SCALE_K)]; else unused
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
    stride_se,
    stride_sn,
    stride_xs,
    up_scale_row,  # the first scale row of the up part: I per channel, cdiv(row0 + I, SCALE_N) per block
    row0,  # block mode: rows of each part's first block before its first row (a rank's share)
    row_tiles,  # the grid's row tiles (_row_tiles)
    TOP_K: tl.constexpr,
    E_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PREC: tl.constexpr,
    DOT_F32: tl.constexpr,
    GROUP_M: tl.constexpr = 0,  # the programs' order (grouping.program_tiles)
    SCALES: tl.constexpr = 0,  # 0: 16/32-bit weights; 1: e4m3 per channel; 2: e4m3 per block
    SCALE_N: tl.constexpr = 1,  # weight rows per block scale (1 per channel)
    SCALE_K: tl.constexpr = 1,  # weight columns per block scale: a multiple of BLOCK_K
    ACT_FP8: tl.constexpr = False,  # x in e4m3 with its scales (per token, or per SCALE_K columns)
):
    tile, pid_n = program_tiles(row_tiles, tl.cdiv(INTER, BLOCK_N), GROUP_M)
    e, rows, row_mask = tile_rows(counts_ptr, E, tile, BLOCK_M, E_PAD)
    if e < 0:
        return
    pairs = tl.load(order_ptr + rows, mask=row_mask, other=0)
    tokens = (pairs // TOP_K).to(tl.int64)
    xs_ptrs = xs_ptr + tokens * stride_xs  # [M]: each row's first activation scale
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, BLOCK_K)
    a_ptrs = x_ptr + tokens[:, None] * stride_x + k[None, :]
    g_ptrs = w_ptr + e.to(tl.int64) * stride_we + n[None, :].to(tl.int64) * stride_wn + k[:, None]  # [K, N]
    u_ptrs = g_ptrs + INTER * stride_wn
    n_mask = n[None, :] < INTER
    sg_ptrs = _scale_ptrs(s_ptr, e, n, stride_se, stride_sn, 0, row0, SCALE_N)  # [N]
    su_ptrs = _scale_ptrs(s_ptr, e, n, stride_se, stride_sn, up_scale_row, row0, SCALE_N)
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        k_in = k < H - k0
        a = tl.load(a_ptrs, mask=row_mask[:, None] & k_in[None, :], other=0.0)
        g = tl.load(g_ptrs, mask=k_in[:, None] & n_mask, other=0.0)
        u = tl.load(u_ptrs, mask=k_in[:, None] & n_mask, other=0.0)
        if SCALES != 0 and not ACT_FP8:  # e4m3 -> the activations' dtype, exactly
            g = g.to(x_ptr.dtype.element_ty)
            u = u.to(x_ptr.dtype.element_ty)
        if DOT_F32:  # interpreter only, see needs_f32_dot
            a = a.to(tl.float32)
            g = g.to(tl.float32)
            u = u.to(tl.float32)
        if SCALES == 2:  # the K tile lies in one block column: its partial products take their scales
            sg = tl.load(sg_ptrs + k0 // SCALE_K, mask=n < INTER, other=0.0)
            su = tl.load(su_ptrs + k0 // SCALE_K, mask=n < INTER, other=0.0)
            if ACT_FP8:  # ... and the activations' group scale (the same columns)
                xs = tl.load(xs_ptrs + k0 // SCALE_K, mask=row_mask, other=0.0)[:, None]
                acc_g += tl.dot(a, g) * xs * sg[None, :]
                acc_u += tl.dot(a, u) * xs * su[None, :]
            else:
                acc_g += tl.dot(a, g, input_precision=DOT_PREC) * sg[None, :]
                acc_u += tl.dot(a, u, input_precision=DOT_PREC) * su[None, :]
        else:
            acc_g = _dot(a, g, acc_g, DOT_PREC, ACT_FP8)
            acc_u = _dot(a, u, acc_u, DOT_PREC, ACT_FP8)
        a_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
        u_ptrs += BLOCK_K
    if SCALES == 1:  # per channel: the fp32 sums times their columns' scales (and each token's)
        acc_g *= tl.load(sg_ptrs, mask=n < INTER, other=0.0)[None, :]
        acc_u *= tl.load(su_ptrs, mask=n < INTER, other=0.0)[None, :]
        if ACT_FP8:
            xs = tl.load(xs_ptrs, mask=row_mask, other=0.0)[:, None]
            acc_g *= xs
            acc_u *= xs
    dt = out_ptr.dtype.element_ty
    gate = acc_g.to(dt).to(tl.float32)
    up = acc_u.to(dt).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(dt).to(tl.float32)
    o_ptrs = out_ptr + rows[:, None].to(tl.int64) * stride_o + n[None, :]
    tl.store(o_ptrs, (act * up).to(dt), mask=row_mask[:, None] & n_mask)


@triton.jit(do_not_specialize=["row_tiles"])
def _down_kernel(
    a_ptr,  # [P, I] in sorted order
    w_ptr,  # [E, H, I] (model dtype, or e4m3 when SCALES)
    s_ptr,  # SCALES 1: [E, H] fp32; SCALES 2: [E, cdiv(H, SCALE_N), cdiv(I, SCALE_K)]; else unused
    as_ptr,  # ACT_FP8: a's scales, [P, 1] per row or [P, cdiv(I, SCALE_K)] per group; else unused
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
    stride_se,
    stride_sn,
    stride_as,
    col0,  # block mode: columns of the first block before the first column (a rank's share of I)
    row_tiles,
    E_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PREC: tl.constexpr,
    DOT_F32: tl.constexpr,
    GROUP_M: tl.constexpr = 0,
    SCALES: tl.constexpr = 0,
    SCALE_N: tl.constexpr = 1,
    SCALE_K: tl.constexpr = 1,
    ACT_FP8: tl.constexpr = False,  # a in e4m3 with its scales (per row, or per SCALE_K columns from 0)
):
    tile, pid_n = program_tiles(row_tiles, tl.cdiv(H, BLOCK_N), GROUP_M)
    e, rows, row_mask = tile_rows(counts_ptr, E, tile, BLOCK_M, E_PAD)
    if e < 0:
        return
    pairs = tl.load(order_ptr + rows, mask=row_mask, other=0)
    as_ptrs = as_ptr + rows.to(tl.int64) * stride_as  # [M]
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None].to(tl.int64) * stride_a + k[None, :]
    w_ptrs = w_ptr + e.to(tl.int64) * stride_we + n[None, :].to(tl.int64) * stride_wn + k[:, None]  # [K, N]
    n_mask = n[None, :] < H
    s_ptrs = _scale_ptrs(s_ptr, e, n, stride_se, stride_sn, 0, 0, SCALE_N)  # [N]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, INTER, BLOCK_K):
        k_in = k < INTER - k0
        a = tl.load(a_ptrs, mask=row_mask[:, None] & k_in[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=k_in[:, None] & n_mask, other=0.0)
        if SCALES != 0 and not ACT_FP8:
            w = w.to(a_ptr.dtype.element_ty)
        if DOT_F32:
            a = a.to(tl.float32)
            w = w.to(tl.float32)
        if SCALES == 2:
            s = tl.load(s_ptrs + (col0 + k0) // SCALE_K, mask=n < H, other=0.0)
            if ACT_FP8:  # a's groups start at its column 0; a K tile lies inside one of them too
                sa = tl.load(as_ptrs + k0 // SCALE_K, mask=row_mask, other=0.0)
                acc += tl.dot(a, w) * sa[:, None] * s[None, :]
            else:
                acc += tl.dot(a, w, input_precision=DOT_PREC) * s[None, :]
        else:
            acc = _dot(a, w, acc, DOT_PREC, ACT_FP8)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if SCALES == 1:
        acc *= tl.load(s_ptrs, mask=n < H, other=0.0)[None, :]
        if ACT_FP8:
            acc *= tl.load(as_ptrs, mask=row_mask, other=0.0)[:, None]
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


def _scale_args(w: Weights, part_rows: int) -> tuple[torch.Tensor, tuple[int, ...], dict]:
    """(the scales, (stride_se, stride_sn, the second part's first scale row, row0, col0), the kernel's
    constexprs) of a weight stack; ``part_rows``: the rows of gate (gate | up) or of the whole stack.
    16/32-bit weights pass themselves in place of scales the kernel never reads."""
    if not isinstance(w, Fp8Experts):
        return w, (0, 0, 0, 0, 0), {}
    s = w.scale
    assert s.dtype == torch.float32 and s.stride(-1) == 1 and w.weight.stride(-1) == 1
    if w.block is None:
        return s, (s.stride(0), 1, part_rows, 0, 0), dict(SCALES=1)
    (rows, cols), (row0, col0) = w.block, w.offset
    assert w.parts == 2 or (row0 + part_rows) % rows == 0 or part_rows == w.weight.shape[1], "unaligned parts"
    first = triton.cdiv(row0 + part_rows, rows)
    return s, (s.stride(0), s.stride(1), first, row0, col0), dict(SCALES=2, SCALE_N=rows, SCALE_K=cols)


def _common(x: torch.Tensor, experts: int, cfg: dict) -> dict:
    prec = "ieee" if x.dtype == torch.float32 or needs_f32_dot(x) else "tf32"
    return dict(E_PAD=triton.next_power_of_2(experts), DOT_PREC=prec, DOT_F32=needs_f32_dot(x), **cfg)


def _row_tiles(pairs: int, experts: int, cfg: dict) -> int:
    return triton.cdiv(pairs, cfg["BLOCK_M"]) + min(experts, pairs)  # the worst case, from ints


def _act_args(x: torch.Tensor, scale: torch.Tensor | None) -> tuple[torch.Tensor, int, dict]:
    """(the activations' scales, their row stride, the kernel's constexpr): e4m3 activations with their
    scales, or 16/32-bit ones (passing themselves in place of scales the kernel never reads)."""
    if scale is None:
        return x, 0, {}
    assert scale.dtype == torch.float32 and scale.stride(-1) == 1
    return scale, scale.stride(0), dict(ACT_FP8=True)


def gate_up_into(
    h: torch.Tensor, gate_up: Weights, counts: torch.Tensor, order: torch.Tensor, act: torch.Tensor,
    top_k: int, cfg: dict, h_scale: torch.Tensor | None = None,
) -> None:  # fmt: skip
    """act [P, I] (sorted order) = silu(gate) * up of each (token, expert) pair: h [T, H] x gate_up.
    ``h_scale``: h is e4m3 with these scales (per token, or per the weight blocks' columns)."""
    w, (experts, inter) = weight_of(gate_up), (weight_of(gate_up).shape[0], act.shape[1])
    s, (se, sn, up_row, row0, _), fp8 = _scale_args(gate_up, inter)
    xs, stride_xs, act_fp8 = _act_args(h, h_scale)
    row_tiles = _row_tiles(order.numel(), experts, cfg)
    _gate_up_kernel[(row_tiles * triton.cdiv(inter, cfg["BLOCK_N"]),)](
        h, w, s, xs, counts, order, act, experts, h.shape[1], inter, h.stride(0), w.stride(0),
        w.stride(1), act.stride(0), se, sn, stride_xs, up_row, row0, row_tiles, TOP_K=top_k, **fp8, **act_fp8,
        **_common(act, experts, cfg),
    )  # fmt: skip


def down_into(
    act: torch.Tensor, down: Weights, counts: torch.Tensor, order: torch.Tensor, y: torch.Tensor, cfg: dict,
    act_scale: torch.Tensor | None = None,
) -> None:  # fmt: skip
    """y [P, H] (pair order) = act [P, I] (sorted order) x down[e]^T. ``act_scale``: act is e4m3."""
    w = weight_of(down)
    experts, hidden, inter = w.shape[0], y.shape[1], act.shape[1]
    s, (se, sn, _, _, col0), fp8 = _scale_args(down, hidden)
    scales, stride_as, act_fp8 = _act_args(act, act_scale)
    row_tiles = _row_tiles(order.numel(), experts, cfg)
    _down_kernel[(row_tiles * triton.cdiv(hidden, cfg["BLOCK_N"]),)](
        act, w, s, scales, counts, order, y, experts, hidden, inter, act.stride(0), w.stride(0),
        w.stride(1), y.stride(0), se, sn, stride_as, col0, row_tiles, **fp8, **act_fp8,
        **_common(y, experts, cfg),
    )  # fmt: skip


def combine_into(y: torch.Tensor, weights: torch.Tensor, out: torch.Tensor) -> None:
    """out [T, H] = sum over the K slots of y [T * K, H] x the routing weights [T, K]."""
    tokens, hidden = out.shape
    block = min(1024, triton.next_power_of_2(hidden))
    _combine_kernel[(tokens, triton.cdiv(hidden, block))](
        y, weights, out, hidden, y.stride(0), out.stride(0),
        TOP_K=weights.shape[1], ROUND_PRODUCT=weights.dtype != torch.float32, BLOCK=block, num_warps=4,
    )  # fmt: skip


def moe_experts(
    h: torch.Tensor,  # [T, H]
    weights: torch.Tensor,  # [T, K] routing weights (model dtype, or fp32)
    ids: torch.Tensor,  # [T, K] expert ids
    gate_up: Weights,  # [E, 2I, H]
    down: Weights,  # [E, H, I]
    config: dict | None = None,  # the GEMM tiles [tile_config's]
) -> torch.Tensor:  # [T, H]
    w_gu, w_down = weight_of(gate_up), weight_of(down)
    assert h.stride(-1) == 1 and w_gu.stride(-1) == 1 and w_down.stride(-1) == 1
    pairs, hidden, inter = ids.numel(), h.shape[1], w_down.shape[2]
    out = torch.empty_like(h)
    if not pairs:
        return out
    counts, order = group_by_expert(ids, w_gu.shape[0])
    cfg = config or tile_config(h, ids, gate_up, down)
    act = torch.empty((pairs, inter), dtype=h.dtype, device=h.device)  # sorted order
    x, x_scale = product_input(h, gate_up)
    gate_up_into(x, gate_up, counts, order, act, ids.shape[1], kernel_tiles(cfg, "gate_up"), x_scale)
    y = torch.empty((pairs, hidden), dtype=h.dtype, device=h.device)  # pair order
    a, a_scale = product_input(act, down)
    down_into(a, down, counts, order, y, kernel_tiles(cfg, "down"), a_scale)
    combine_into(y, weights, out)
    return out


def product_input(x: torch.Tensor, w: Weights) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A product's input as the weights take it: e4m3 with dynamic scales (per row, or per the weight
    blocks' columns) for ``Fp8Experts.act_fp8``, else as it is."""
    if not (isinstance(w, Fp8Experts) and w.act_fp8):
        return x, None
    act = quantize_act(x, ActQuant(act_group(w)))
    return act.data, act.scale
