"""Triton SiLU-and-multiply over the fused gate|up projection: [T, 2I] -> [T, I] in one pass.

Same rounding as transformers' ``act_fn(gate) * up`` in the model dtype: the activation is computed in
fp32 and rounded, then the product is rounded. With ``quant`` (down_proj takes FP8 input) the product is
quantized to e4m3 in the same kernel, over (row, column block) programs: per group of columns in one pass,
or per row in two kernels (the first finds each block's absolute maximum, the second the row's scale from
those, recomputes and stores; gate|up is read twice, from L2 at decode), or, with many rows, one program
per whole row in one pass.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from batchgen.kernels.fp8_format import MIN_SCALE, ActQuant, Fp8Act
from batchgen.kernels.fp8_format import quantize_act as quantize_static
from batchgen.kernels.gemm import fp8_quant
from batchgen.kernels.gemm.fp8_quant import quantize_tile, to_fp8
from batchgen.kernels.launch.device import num_sms
from batchgen.kernels.launch.pdl import pdl_options, wait_for_producer

_BLOCK = 1024
# The widest row one program holds in one-pass quantization: 32K columns over 16 warps, 64 values a thread.
MAX_ROW_BLOCK = 32768


@triton.jit
def silu_times(gate, up, dt: tl.constexpr):
    """silu(gate) * up of fp32 values of model-dtype numbers, rounded like transformers, as fp32."""
    act = (gate / (1.0 + tl.exp(-gate))).to(dt)
    return (act.to(tl.float32) * up).to(dt).to(tl.float32)


@triton.jit
def _silu_mul_tile(x_row, cols, n_cols, dt: tl.constexpr):
    """silu(gate) * up for columns ``cols`` of one row, rounded like transformers, as fp32."""
    mask = cols < n_cols
    gate = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_row + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    return silu_times(gate, up, dt)


@triton.jit
def _silu_mul_kernel(
    x_ptr, out_ptr, stride_x, stride_o, n_cols, BLOCK: tl.constexpr, PDL: tl.constexpr = False
):
    wait_for_producer(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    y = _silu_mul_tile(x_ptr + row * stride_x, cols, n_cols, out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * stride_o + cols, y.to(out_ptr.dtype.element_ty), mask=cols < n_cols)


@triton.jit
def _silu_mul_amax_kernel(
    x_ptr, amax_ptr, stride_x, n_cols, n_blocks, BLOCK: tl.constexpr, PDL: tl.constexpr = False
):
    """Per-row quantization, first pass: each program's largest |silu(gate) * up| over its columns."""
    wait_for_producer(PDL)
    row = tl.program_id(0).to(tl.int64)
    blk = tl.program_id(1)
    cols = blk * BLOCK + tl.arange(0, BLOCK)
    y = _silu_mul_tile(x_ptr + row * stride_x, cols, n_cols, x_ptr.dtype.element_ty)
    tl.store(amax_ptr + row * n_blocks + blk, tl.max(tl.abs(y), 0))


@triton.jit
def _silu_mul_quant_kernel(
    x_ptr,  # [T, 2I] model dtype (GATED), else [T, I]: silu(gate) * up already
    amax_ptr,  # [T, n_amax] fp32: maxima of column blocks (per-row scales only)
    q_ptr,  # [T, I] e4m3
    s_ptr,  # [T, n_groups] fp32
    stride_x,
    stride_q,
    n_cols,
    n_amax,
    n_groups,
    min_scale,
    GROUP: tl.constexpr,  # 0: one scale per row
    BLOCK: tl.constexpr,
    AMAX_PAD: tl.constexpr,
    ROUND: tl.constexpr,
    GATED: tl.constexpr = True,
    PDL: tl.constexpr = False,
):
    wait_for_producer(PDL)
    row = tl.program_id(0).to(tl.int64)
    blk = tl.program_id(1)
    cols = blk * BLOCK + tl.arange(0, BLOCK)
    if GATED:
        y = _silu_mul_tile(x_ptr + row * stride_x, cols, n_cols, x_ptr.dtype.element_ty)
    else:
        y = tl.load(x_ptr + row * stride_x + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    if GROUP == 0:
        b = tl.arange(0, AMAX_PAD)
        amax = tl.load(amax_ptr + row * n_amax + b, mask=b < n_amax, other=0.0)
        scale = tl.maximum(tl.max(amax, 0) / 448.0, min_scale)
        one = tl.arange(0, 1)  # the first block stores the row's scale (a vector mask: the interpreter's)
        tl.store(s_ptr + row + one, tl.zeros([1], tl.float32) + scale, mask=one < tl.where(blk == 0, 1, 0))
        q = y / scale
    else:
        q, scales = quantize_tile(y, min_scale, GROUP, BLOCK)
        grp = blk * (BLOCK // GROUP) + tl.arange(0, BLOCK // GROUP)
        tl.store(s_ptr + row * n_groups + grp, scales, mask=grp < n_groups)
    tl.store(q_ptr + row * stride_q + cols, to_fp8(q, q_ptr.dtype.element_ty, ROUND), mask=cols < n_cols)


@triton.jit
def _silu_mul_row_quant_kernel(
    x_ptr,  # [T, 2I] model dtype
    q_ptr,  # [T, I] e4m3
    s_ptr,  # [T, 1] fp32
    stride_x,
    stride_q,
    n_cols,
    min_scale,
    BLOCK: tl.constexpr,  # the whole row
    ROUND: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Per-row quantization in one pass, for many rows: a program holds its whole row, so gate|up is read
    once (a prefill step's rows do not stay in L2 between two kernels)."""
    wait_for_producer(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    y = _silu_mul_tile(x_ptr + row * stride_x, cols, n_cols, x_ptr.dtype.element_ty)
    scale = tl.maximum(tl.max(tl.abs(y), 0) / 448.0, min_scale)
    tl.store(s_ptr + row, scale)
    tl.store(
        q_ptr + row * stride_q + cols, to_fp8(y / scale, q_ptr.dtype.element_ty, ROUND), mask=cols < n_cols
    )


def silu_mul(x: torch.Tensor, quant: ActQuant | None = None) -> torch.Tensor | Fp8Act:
    """x: [T, 2 * I] (gate | up) -> [T, I]; an ``Fp8Act`` with ``quant``."""
    assert x.dim() == 2 and x.shape[1] % 2 == 0 and x.stride(-1) == 1
    rows, cols = x.shape[0], x.shape[1] // 2
    if quant is not None and quant.static_scale is None:
        return _silu_mul_quant(x, quant.group)
    out = torch.empty((rows, cols), dtype=x.dtype, device=x.device)
    if rows:
        _silu_mul_kernel[(rows, triton.cdiv(cols, _BLOCK))](
            x, out, x.stride(0), out.stride(0), cols, BLOCK=_BLOCK, num_warps=4, **pdl_options(x)
        )
    return out if quant is None else quantize_static(out, quant)


def _silu_mul_quant(x: torch.Tensor, group: int | None, whole_rows: bool | None = None) -> Fp8Act:
    """Over (row, column block) programs: a decode step's 32 rows of 14336 columns are 448 programs
    where one program per row was 32, too few to fill the GPU. Per-row scales take a first pass for each
    block's maximum (gate|up is read twice, from L2 at decode). With rows enough to fill the GPU
    (``whole_rows``, default: 2 per SM), one program per row reads gate|up once instead: in a prefill the
    two-pass kernels took about twice their bytes' time (docs/results.md)."""
    rows, cols = x.shape[0], x.shape[1] // 2
    out = fp8_quant.act_buffers(x[:, :cols], group)
    if not rows:
        return out
    row_block = triton.next_power_of_2(cols)
    if whole_rows is None:
        whole_rows = rows >= 2 * num_sms(x.device) and row_block <= MAX_ROW_BLOCK
    if group is None and whole_rows:
        assert row_block <= MAX_ROW_BLOCK, f"{cols} columns: too wide for one program"
        _silu_mul_row_quant_kernel[(rows,)](
            x, out.data, out.scale, x.stride(0), out.data.stride(0), cols, MIN_SCALE, BLOCK=row_block,
            ROUND=fp8_quant.exact_rounding(x), num_warps=max(4, min(16, row_block // 1024)), **pdl_options(x)
        )  # fmt: skip
        return out
    block = max(min(row_block, _BLOCK), group or 1)
    n_blocks = triton.cdiv(cols, block)
    amax = out.scale  # unused by per-group scales
    if group is None:
        amax = torch.empty((rows, n_blocks), dtype=torch.float32, device=x.device)
        _silu_mul_amax_kernel[(rows, n_blocks)](
            x, amax, x.stride(0), cols, n_blocks, BLOCK=block, num_warps=4, **pdl_options(x)
        )
    _silu_mul_quant_kernel[(rows, n_blocks)](
        x, amax, out.data, out.scale, x.stride(0), out.data.stride(0), cols, n_blocks, out.scale.shape[1],
        MIN_SCALE, GROUP=group or 0, BLOCK=block, AMAX_PAD=triton.next_power_of_2(n_blocks),
        ROUND=fp8_quant.exact_rounding(x), num_warps=4, **pdl_options(x)
    )  # fmt: skip
    return out


def quantize_by_maxima(h: torch.Tensor, amax: torch.Tensor) -> Fp8Act:
    """h [T, I] (silu(gate) * up, model dtype) -> e4m3 per row, the row's scale from ``amax`` [T, B]:
    the maxima of |h| over B column blocks, written by the kernel that produced h (the FP8 gate|up
    product with SiLU in its epilogue, ``gate_up_silu.silu_mul_product``)."""
    rows, cols = h.shape
    out = fp8_quant.act_buffers(h, None)
    block = min(triton.next_power_of_2(cols), _BLOCK)
    if rows:
        _silu_mul_quant_kernel[(rows, triton.cdiv(cols, block))](
            h, amax, out.data, out.scale, h.stride(0), out.data.stride(0), cols, amax.shape[1], 1, MIN_SCALE,
            GROUP=0, BLOCK=block, AMAX_PAD=triton.next_power_of_2(amax.shape[1]),
            ROUND=fp8_quant.exact_rounding(h), GATED=False, num_warps=4, **pdl_options(h),
        )  # fmt: skip
    return out
