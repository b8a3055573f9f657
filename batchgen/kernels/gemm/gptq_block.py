"""One GPTQ block of columns on the GPU (``model/weights/gptq.py``): the column-by-column rounding inside a
block of up to 128 input columns is a sequential loop of small products; run as torch ops it is bound by
their launches (a handful per column, tens of thousands of columns per layer). Here one launch rounds the
whole block: each program holds the block's rows for its output columns in registers and walks the block's
columns in order, exactly as the torch loop does (fp32, the same operations in the same order, no fused
multiply-adds, divisions rounded to nearest: the same codes and errors bit for bit).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from batchgen.kernels.gemm.fp8_quant import exact_rounding, to_fp8

BLOCK_N = 64  # output columns a program rounds


@triton.jit
def _gptq_block_kernel(
    w_ptr,  # [cols, N] fp32: the block's input columns (GPTQ's order) for every output column
    s_ptr,  # [cols, N] fp32 scales
    u_ptr,  # [cols, cols] fp32: the block's part of the inverse Hessian's upper Cholesky factor
    codes_ptr,  # [cols, N] e4m3 out
    err_ptr,  # [cols, N] fp32 out: each column's rounding error over its factor's diagonal
    N,
    cols,
    stride_w,
    stride_s,
    stride_u,
    stride_c,
    B: tl.constexpr,  # cols rounded up to a power of two
    BLOCK: tl.constexpr,
    ROUND: tl.constexpr,
):
    rn = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    n_ok = rn < N
    rb = tl.arange(0, B)
    b_ok = rb < cols
    w = tl.load(w_ptr + rb[:, None] * stride_w + rn[None, :], mask=b_ok[:, None] & n_ok[None, :], other=0.0)
    for j in range(0, cols):
        row = tl.sum(tl.where(rb[:, None] == j, w, 0.0), axis=0)  # [BLOCK]: column j, its updates applied
        scale = tl.load(s_ptr + j * stride_s + rn, mask=n_ok, other=1.0)
        q = to_fp8(tl.math.div_rn(row, scale), codes_ptr.dtype.element_ty, ROUND)
        err = tl.math.div_rn(row - q.to(tl.float32) * scale, tl.load(u_ptr + j * stride_u + j))
        tl.store(codes_ptr + j * stride_c + rn, q, mask=n_ok)
        tl.store(err_ptr + j * N + rn, err, mask=n_ok)
        later = tl.load(u_ptr + j * stride_u + rb, mask=b_ok & (rb > j), other=0.0)  # u[j, j + 1:]
        w -= later[:, None] * err[None, :]


def round_block(w: torch.Tensor, scales: torch.Tensor, u: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """Round one block: ``w``, ``scales`` [cols, N] fp32 (row-contiguous), ``u`` [cols, cols] its factor
    block; writes ``codes`` [cols, N] e4m3 and returns the errors [cols, N] that later blocks take."""
    cols, n = w.shape
    u = u.contiguous()  # a Cholesky factor may come transposed (column-major): rows are read here
    errors = torch.empty((cols, n), dtype=torch.float32, device=w.device)
    _gptq_block_kernel[(triton.cdiv(n, BLOCK_N),)](
        w, scales, u, codes, errors, n, cols, w.stride(0), scales.stride(0), u.stride(0), codes.stride(0),
        B=triton.next_power_of_2(cols), BLOCK=BLOCK_N, ROUND=exact_rounding(w), enable_fp_fusion=False,
        num_warps=4,
    )  # fmt: skip
    return errors
