"""Triton SiLU-and-multiply over the fused gate|up projection: [T, 2I] -> [T, I] in one pass.

Same rounding as transformers' ``act_fn(gate) * up`` in the model dtype: the activation is computed in
fp32 and rounded, then the product is rounded.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK = 1024


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, stride_x, stride_o, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    dt = out_ptr.dtype.element_ty
    act = (gate / (1.0 + tl.exp(-gate))).to(dt)
    tl.store(out_ptr + row * stride_o + cols, (act.to(tl.float32) * up).to(dt), mask=mask)


def silu_mul(x: torch.Tensor) -> torch.Tensor:  # x: [T, 2 * I] (gate | up) -> [T, I]
    assert x.dim() == 2 and x.shape[1] % 2 == 0 and x.stride(-1) == 1
    rows, cols = x.shape[0], x.shape[1] // 2
    out = torch.empty((rows, cols), dtype=x.dtype, device=x.device)
    if rows:
        _silu_mul_kernel[(rows, triton.cdiv(cols, _BLOCK))](
            x, out, x.stride(0), out.stride(0), cols, BLOCK=_BLOCK, num_warps=4
        )
    return out
