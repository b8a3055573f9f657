"""Triton FP8 (e4m3) helpers and the activation quantization kernel; the same arithmetic as
``fp8_format``: a dynamic scale ``max(amax / 448, MIN_SCALE)`` per row or per group of columns, values
``x / scale`` saturated to +-448 and rounded to nearest even.

The fused producers (RMSNorm in ``norm.py``, SiLU-and-multiply in ``activation.py``) quantize their output
with ``quantize_tile`` before storing it, so a projection's input is written once, in FP8, and no separate
quantization launch runs. ``quantize_act`` is the stand-alone kernel for inputs made elsewhere (o_proj's).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from batchgen.kernels.fp8_format import FP8_MAX, MIN_SCALE, ActQuant, Fp8Act
from batchgen.kernels.launch.pdl import pdl_options, wait_for_producer


@triton.jit
def round_e4m3(x):
    """x (fp32, within +-448) rounded to the nearest e4m3 value, ties to even, still in fp32.

    Off-GPU only: Triton 3.9's interpreter casts to e4m3 without carrying a rounded-up mantissa into the
    exponent (127.1 -> 64), so values are rounded here first and the cast then only re-encodes them."""
    bits = x.to(tl.int32, bitcast=True)
    exp = tl.maximum(((bits >> 23) & 0xFF) - 127, -6)  # below 2^-6 e4m3 is subnormal: a fixed step
    step = tl.exp2((exp - 3).to(tl.float32))  # 3 mantissa bits
    r = tl.abs(x) / step  # exact: a power-of-two scaling
    f = tl.floor(r + 0.5)
    odd = (f.to(tl.int32) & 1) != 0
    f = tl.where(((f - r) == 0.5) & odd, f - 1.0, f) * step
    return tl.where(bits < 0, -f, f)  # the sign bit, so -0.0 stays -0.0 as in torch's cast


@triton.jit
def to_fp8(x, dtype: tl.constexpr, ROUND: tl.constexpr):
    """fp32 -> e4m3 (``dtype``), saturated; ``ROUND`` on the interpreter (see ``round_e4m3``)."""
    x = tl.minimum(tl.maximum(x, -448.0), 448.0)
    if ROUND:
        x = round_e4m3(x)
    return x.to(dtype)


@triton.jit
def quantize_tile(h, min_scale, GROUP: tl.constexpr, BLOCK: tl.constexpr):
    """h [BLOCK] fp32 -> (h / scale [BLOCK], scales [BLOCK // GROUP]): one scale per GROUP columns."""
    g = tl.reshape(h, [BLOCK // GROUP, GROUP])
    scale = tl.maximum(tl.max(tl.abs(g), axis=1) / 448.0, min_scale)  # [BLOCK // GROUP]
    return tl.reshape(g / scale[:, None], [BLOCK]), scale


@triton.jit
def _quant_kernel(
    x_ptr,  # [T, K] model dtype
    q_ptr,  # [T, K] e4m3
    s_ptr,  # [T, 1] per token, [T, cdiv(K, GROUP)] per group, fp32
    stride_x,
    stride_q,
    n_cols,
    n_groups,
    min_scale,
    GROUP: tl.constexpr,  # 0: one scale per row
    BLOCK: tl.constexpr,
    ROUND: tl.constexpr,
    PDL: tl.constexpr = False,
):
    wait_for_producer(PDL)
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    q_row = q_ptr + row * stride_q
    q_dt = q_ptr.dtype.element_ty
    if GROUP == 0:
        amax = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            amax = tl.maximum(
                amax, tl.abs(tl.load(x_row + cols, mask=cols < n_cols, other=0.0).to(tl.float32))
            )
        scale = tl.maximum(tl.max(amax, 0) / 448.0, min_scale)
        tl.store(s_ptr + row, scale)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(x_row + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
            tl.store(q_row + cols, to_fp8(x / scale, q_dt, ROUND), mask=cols < n_cols)
    else:
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(x_row + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
            q, scales = quantize_tile(x, min_scale, GROUP, BLOCK)
            tl.store(q_row + cols, to_fp8(q, q_dt, ROUND), mask=cols < n_cols)
            grp = start // GROUP + tl.arange(0, BLOCK // GROUP)
            tl.store(s_ptr + row * n_groups + grp, scales, mask=grp < n_groups)


def exact_rounding(t: torch.Tensor) -> bool:
    """Whether kernels must round to e4m3 themselves before casting (the interpreter; see round_e4m3)."""
    return t.device.type != "cuda"


def act_buffers(x: torch.Tensor, group: int | None) -> Fp8Act:
    """Uninitialised outputs for quantizing ``x`` [T, K]: e4m3 [T, K] and its fp32 scales."""
    rows, cols = x.shape
    n_scales = 1 if group is None else triton.cdiv(cols, group)
    data = torch.empty((rows, cols), dtype=torch.float8_e4m3fn, device=x.device)
    return Fp8Act(data, torch.empty((rows, n_scales), dtype=torch.float32, device=x.device))


def quantize_act(x: torch.Tensor, quant: ActQuant) -> Fp8Act:
    """[T, K] -> e4m3 with dynamic scales per row or group (static scales: ``fp8_format``'s torch ops)."""
    if quant.static_scale is not None:
        from batchgen.kernels.fp8_format import quantize_act as static

        return static(x, quant)
    assert x.dim() == 2 and x.stride(-1) == 1
    out = act_buffers(x, quant.group)
    rows, cols = x.shape
    if rows:
        group = quant.group or 0
        block = min(triton.next_power_of_2(cols), 2048)
        block = max(block, group)
        _quant_kernel[(rows,)](
            x, out.data, out.scale, x.stride(0), out.data.stride(0), cols, out.scale.shape[1], MIN_SCALE,
            GROUP=group, BLOCK=block, ROUND=exact_rounding(x), num_warps=4, **pdl_options(x)
        )  # fmt: skip
    return out


__all__ = ["FP8_MAX", "act_buffers", "exact_rounding", "quantize_act", "quantize_tile", "to_fp8"]
