"""Triton RMSNorm with the residual add fused in: one program per token row, one read and one write.

Same arithmetic as ``reference.rms_norm`` (transformers' order): the residual sum is rounded to the
model dtype before it is normalised and stored back, the mean square is taken in fp32, the normalised
row is rounded to the model dtype before the weight product.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(
    x_ptr,  # [T, H]
    residual_ptr,  # [T, H], updated in place to x + residual when HAS_RESIDUAL
    weight_ptr,  # [H]
    out_ptr,  # [T, H]
    stride_x,
    stride_r,
    stride_o,
    n_cols,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(residual_ptr + row * stride_r + cols, x, mask=mask)
    h = x.to(tl.float32)
    mean_square = tl.sum(h * h, axis=0) / n_cols
    h = (h * tl.rsqrt(mean_square + eps)).to(x_ptr.dtype.element_ty)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0)
    out = h.to(tl.float32) * w.to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(
    x: torch.Tensor,  # [T, H]
    weight: torch.Tensor,  # [H]
    eps: float,
    residual: torch.Tensor | None = None,  # [T, H], updated in place
) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(x + residual), x + residual); without a residual, (RMSNorm(x), x)."""
    assert x.dim() == 2 and x.stride(-1) == 1 and (residual is None or residual.stride(-1) == 1)
    out = torch.empty_like(x)
    rows, cols = x.shape
    if rows == 0:
        return out, x if residual is None else residual
    block = triton.next_power_of_2(cols)
    _rms_norm_kernel[(rows,)](
        x, residual if residual is not None else x, weight, out,
        x.stride(0), residual.stride(0) if residual is not None else 0, out.stride(0), cols, eps,
        HAS_RESIDUAL=residual is not None, BLOCK=block, num_warps=max(1, min(16, block // 512)),
    )  # fmt: skip
    return out, x if residual is None else residual
