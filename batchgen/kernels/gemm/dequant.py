"""Weight-only products of prompt-sized inputs through cuBLAS: the e4m3 weight [N, K] widened to the
input's dtype with its row scales applied, ``w[n, k] * scale[n]`` rounded once, then a 16-bit ``F.linear``.
Widening costs 3 bytes a weight (1 read, 2 written) per product, small beside a prompt step's FLOPs;
decode-sized products read the e4m3 weights in place instead (``fp8_gemm.triton_fp8_matmul``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def _dequant_kernel(w_ptr, s_ptr, out_ptr, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    ok = (rn < N)[:, None] & (rk < K)[None, :]
    offs = rn.to(tl.int64)[:, None] * K + rk[None, :]
    w = tl.load(w_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    s = tl.load(s_ptr + rn, mask=rn < N, other=0.0)
    tl.store(out_ptr + offs, (w * s[:, None]).to(out_ptr.dtype.element_ty), mask=ok)


def dequantize(weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """e4m3 [N, K] (row-major) x fp32 row scales [N] -> [N, K] in ``dtype``."""
    n, k = weight.shape
    out = torch.empty((n, k), dtype=dtype, device=weight.device)
    _dequant_kernel[(triton.cdiv(n, 64), triton.cdiv(k, 128))](
        weight, scale, out, n, k, BLOCK_N=64, BLOCK_K=128, num_warps=4
    )
    return out


def dequantized_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [M, K] (16-bit) @ (weight * scale)^T -> [M, N] in x's dtype."""
    return F.linear(x, dequantize(weight, scale, x.dtype))
