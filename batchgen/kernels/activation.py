"""Triton SiLU-and-multiply over the fused gate|up projection: [T, 2I] -> [T, I] in one pass.

Same rounding as transformers' ``act_fn(gate) * up`` in the model dtype: the activation is computed in
fp32 and rounded, then the product is rounded. With ``quant`` (down_proj takes FP8 input) the product is
quantized to e4m3 in the same kernel: per group of columns in one pass, or per row in two (the first finds
the row's absolute maximum, the second recomputes and stores; gate|up is read twice, from L2 at decode).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from batchgen.kernels import fp8_quant
from batchgen.kernels.fp8_quant import quantize_tile, to_fp8
from batchgen.kernels.fp8_reference import MIN_SCALE, ActQuant, Fp8Act
from batchgen.kernels.fp8_reference import quantize_act as quantize_static

_BLOCK = 1024


@triton.jit
def _silu_mul_tile(x_row, cols, n_cols, dt: tl.constexpr):
    """silu(gate) * up for columns ``cols`` of one row, rounded like transformers, as fp32."""
    mask = cols < n_cols
    gate = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_row + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(dt)
    return (act.to(tl.float32) * up).to(dt).to(tl.float32)


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, stride_x, stride_o, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    y = _silu_mul_tile(x_ptr + row * stride_x, cols, n_cols, out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * stride_o + cols, y.to(out_ptr.dtype.element_ty), mask=cols < n_cols)


@triton.jit
def _silu_mul_quant_kernel(
    x_ptr,  # [T, 2I] model dtype
    q_ptr,  # [T, I] e4m3
    s_ptr,  # [T, n_groups] fp32
    stride_x,
    stride_q,
    n_cols,
    n_groups,
    min_scale,
    GROUP: tl.constexpr,  # 0: one scale per row
    BLOCK: tl.constexpr,
    ROUND: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    q_row = q_ptr + row * stride_q
    dt = x_ptr.dtype.element_ty
    q_dt = q_ptr.dtype.element_ty
    if GROUP == 0:
        amax = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK):
            amax = tl.maximum(amax, tl.abs(_silu_mul_tile(x_row, start + tl.arange(0, BLOCK), n_cols, dt)))
        scale = tl.maximum(tl.max(amax, 0) / 448.0, min_scale)
        tl.store(s_ptr + row, scale)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            y = _silu_mul_tile(x_row, cols, n_cols, dt)
            tl.store(q_row + cols, to_fp8(y / scale, q_dt, ROUND), mask=cols < n_cols)
    else:
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            q, scales = quantize_tile(_silu_mul_tile(x_row, cols, n_cols, dt), min_scale, GROUP, BLOCK)
            tl.store(q_row + cols, to_fp8(q, q_dt, ROUND), mask=cols < n_cols)
            grp = start // GROUP + tl.arange(0, BLOCK // GROUP)
            tl.store(s_ptr + row * n_groups + grp, scales, mask=grp < n_groups)


def silu_mul(x: torch.Tensor, quant: ActQuant | None = None) -> torch.Tensor | Fp8Act:
    """x: [T, 2 * I] (gate | up) -> [T, I]; an ``Fp8Act`` with ``quant``."""
    assert x.dim() == 2 and x.shape[1] % 2 == 0 and x.stride(-1) == 1
    rows, cols = x.shape[0], x.shape[1] // 2
    if quant is not None and quant.static_scale is None:
        return _silu_mul_quant(x, quant.group)
    out = torch.empty((rows, cols), dtype=x.dtype, device=x.device)
    if rows:
        _silu_mul_kernel[(rows, triton.cdiv(cols, _BLOCK))](
            x, out, x.stride(0), out.stride(0), cols, BLOCK=_BLOCK, num_warps=4
        )
    return out if quant is None else quantize_static(out, quant)


def _silu_mul_quant(x: torch.Tensor, group: int | None) -> Fp8Act:
    rows, cols = x.shape[0], x.shape[1] // 2
    out = fp8_quant.act_buffers(x[:, :cols], group)
    if rows:
        block = max(min(triton.next_power_of_2(cols), 2 * _BLOCK), group or 1)
        _silu_mul_quant_kernel[(rows,)](
            x, out.data, out.scale, x.stride(0), out.data.stride(0), cols, out.scale.shape[1], MIN_SCALE,
            GROUP=group or 0, BLOCK=block, ROUND=fp8_quant.exact_rounding(x), num_warps=4,
        )  # fmt: skip
    return out
