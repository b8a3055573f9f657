"""Triton RMSNorm with the residual add fused in: one program per token row, one read and one write.

Same arithmetic as ``reference.rms_norm`` (transformers' order): the residual sum is rounded to the
model dtype before it is normalised and stored back, the mean square is taken in fp32, the normalised
row is rounded to the model dtype before the weight product. With ``quant`` (the next projection takes
FP8 input) the row is quantized to e4m3 in the same program, per row or per group of columns, instead of
being stored in the model dtype: the projection's input is written once and no quantization launch runs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from batchgen.kernels.fp8_format import MIN_SCALE, ActQuant, Fp8Act
from batchgen.kernels.fp8_format import quantize_act as quantize_static
from batchgen.kernels.gemm import fp8_quant
from batchgen.kernels.gemm.fp8_quant import quantize_tile, to_fp8
from batchgen.kernels.gemm.split_sums import SplitSums
from batchgen.kernels.gemm.split_sums_triton import load_product
from batchgen.kernels.launch.pdl import pdl_options, wait_for_producer


@triton.jit
def _rms_norm_kernel(
    x_ptr,  # [T, H]; with SPLITS > 1 [SPLITS, T, H] fp32 partial products, added here
    residual_ptr,  # [T, H], updated in place to x + residual when HAS_RESIDUAL
    weight_ptr,  # [H]
    out_ptr,  # [T, H]: model dtype, or e4m3 when QUANT
    scale_ptr,  # [T, n_groups] fp32, written when QUANT
    stride_x,
    stride_r,
    stride_o,
    n_cols,
    n_groups,
    eps,
    min_scale,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
    QUANT: tl.constexpr,
    GROUP: tl.constexpr,  # columns per scale when QUANT (BLOCK: the whole row)
    ROUND: tl.constexpr,
    SPLITS: tl.constexpr = 1,
    stride_split=0,
    PDL: tl.constexpr = False,
):
    wait_for_producer(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    dt = residual_ptr.dtype.element_ty
    x = load_product(x_ptr, row * stride_x + cols, mask, stride_split, SPLITS, dt)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(dt)
        tl.store(residual_ptr + row * stride_r + cols, x, mask=mask)
    h = x.to(tl.float32)
    mean_square = tl.sum(h * h, axis=0) / n_cols
    h = (h * tl.rsqrt(mean_square + eps)).to(dt)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0)
    out = (h.to(tl.float32) * w.to(tl.float32)).to(dt)  # the model-dtype output, quantized from there
    if QUANT:
        q, scales = quantize_tile(out.to(tl.float32), min_scale, GROUP, BLOCK)
        tl.store(out_ptr + row * stride_o + cols, to_fp8(q, out_ptr.dtype.element_ty, ROUND), mask=mask)
        grp = tl.arange(0, BLOCK // GROUP)
        tl.store(scale_ptr + row * n_groups + grp, scales, mask=grp < n_groups)
    else:
        tl.store(out_ptr + row * stride_o + cols, out, mask=mask)


def rms_norm(
    x: torch.Tensor | SplitSums,  # [T, H]
    weight: torch.Tensor,  # [H]
    eps: float,
    residual: torch.Tensor | None = None,  # [T, H], updated in place
    quant: ActQuant | None = None,
) -> tuple[torch.Tensor | Fp8Act, torch.Tensor]:
    """(RMSNorm(x + residual), x + residual); without a residual, (RMSNorm(x), x). With ``quant`` the
    first is an ``Fp8Act`` (a static scale quantizes after the norm, with torch ops). ``x`` may be a
    product's split-K partials (with a residual): the kernel adds them."""
    splits, split_stride = 1, 0
    if isinstance(x, SplitSums):
        assert residual is not None and x.dtype == residual.dtype, "partials are added to a residual"
        splits, split_stride, x = x.partials.shape[0], x.partials.stride(0), x.partials[0]
    assert x.dim() == 2 and x.stride(-1) == 1 and (residual is None or residual.stride(-1) == 1)
    rows, cols = x.shape
    block = triton.next_power_of_2(cols)
    fused = quant is not None and quant.static_scale is None
    group = (quant.group or block) if fused else block
    block = max(block, group)
    like = x if residual is None else residual  # the model dtype (x may be fp32 partials)
    if fused:
        out = fp8_quant.act_buffers(like, quant.group)
    else:
        out = Fp8Act(torch.empty_like(like), x.new_empty(0))
    if rows:
        _rms_norm_kernel[(rows,)](
            x, residual if residual is not None else x, weight, out.data, out.scale,
            x.stride(0), residual.stride(0) if residual is not None else 0, out.data.stride(0), cols,
            out.scale.shape[-1] if fused else 1, eps, MIN_SCALE,
            HAS_RESIDUAL=residual is not None, BLOCK=block, QUANT=fused, GROUP=group,
            ROUND=fp8_quant.exact_rounding(x), SPLITS=splits, stride_split=split_stride,
            num_warps=max(1, min(16, block // 512)), **pdl_options(x),
        )  # fmt: skip
    summed = x if residual is None else residual
    if fused:
        return out, summed
    if quant is not None:
        return quantize_static(out.data, quant), summed
    return out.data, summed
