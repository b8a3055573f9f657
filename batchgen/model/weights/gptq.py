"""GPTQ rounding of e4m3 weights (``--quantization fp8``; Frantar et al., "GPTQ", 2022).

Round to nearest gives each weight its closest e4m3 code on its own. GPTQ rounds a projection's input
columns one at a time and spreads each column's rounding error onto the columns not rounded yet, through
the inverse Hessian ``H = X^T X`` of inputs X recorded on calibration text, so that the product ``X W^T``
moves as little as it can. The codes stay e4m3 under the same per-row absmax scales, so the products, the
kernels and the memory are those of round to nearest; only which code each weight gets changes.

Columns go in order of decreasing H diagonal (act-order: the inputs with the most energy first, while
the most columns are left to absorb their error), in blocks of ``BLOCK`` (updates to later blocks batched).
"""

from __future__ import annotations

import torch

from batchgen.kernels import fp8_format

BLOCK = 128
DAMP = 0.1  # x the mean of H's diagonal, added to it: the calibration text says little of inputs it lacks


class InputRecorder:
    """A projection that adds its inputs' X^T X into ``hessian`` (fp32, [K, K], summed over the calibration
    tokens; None until an input came), then computes as before: put in place of a layer's projection while
    calibration text runs through it."""

    def __init__(self, linear) -> None:
        self.linear, self.hessian = linear, None
        self.act_quant, self.out_features = linear.act_quant, linear.out_features

    def __call__(self, x: torch.Tensor, summed: bool = True) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).float()  # [T, K]
        if self.hessian is None:
            self.hessian = torch.zeros(flat.shape[1], flat.shape[1], device=x.device)
        self.hessian.addmm_(flat.T, flat)
        return self.linear(x, summed)


def _inverse_factor(hessian: torch.Tensor) -> torch.Tensor:
    """The upper Cholesky factor of H^-1 (damped; inputs never seen get a unit diagonal)."""
    h = hessian.clone()
    dead = h.diagonal() == 0
    h[dead, dead] = 1.0
    h.diagonal().add_(DAMP * h.diagonal().mean())
    return torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)


def gptq_round(
    weight: torch.Tensor, scale: torch.Tensor, hessian: torch.Tensor, act_order: bool = True,
    kernel: bool | None = None,
) -> torch.Tensor:  # fmt: skip
    """[N, K] weight, its scales ([N] per row, or [N, K] one per weight, as per-row-per-group layouts
    expand; a code's value is ``q * scale``), [K, K] Hessian -> e4m3 codes [N, K]. A diagonal Hessian
    (uncorrelated inputs) gives round to nearest's codes. ``act_order`` False: columns in their order.
    ``kernel``: each block rounded by one Triton launch (``kernels/gemm/gptq_block.py``: the same codes;
    default on CUDA, where the torch loop's launches would take minutes for an 8B model)."""
    k = weight.shape[1]
    order = torch.argsort(hessian.diagonal(), descending=True, stable=True) if act_order else torch.arange(k)
    w = weight.float().T[order].contiguous()  # [K, N]: a column of the weight is a row here
    scales = (scale.float().expand(k, -1) if scale.dim() == 1 else scale.float().T)[order].contiguous()
    u = _inverse_factor(hessian.double()[order][:, order]).float()  # factored in fp64, applied in fp32
    codes = torch.empty(w.shape, dtype=fp8_format.FP8, device=w.device)
    round_block = _block_kernel if (w.is_cuda if kernel is None else kernel) else _block_loop
    for b0 in range(0, k, BLOCK):
        b1 = min(b0 + BLOCK, k)
        errors = round_block(w[b0:b1], scales[b0:b1], u[b0:b1, b0:b1], codes[b0:b1])
        w[b1:] -= u[b0:b1, b1:].T @ errors
    return codes[torch.argsort(order)].T.contiguous()


def _block_loop(w: torch.Tensor, scales: torch.Tensor, u: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """One block's columns rounded in order, each error spread over the block's later columns; the
    errors [cols, N] for the later blocks. (``w`` is updated in place.)"""
    errors = torch.empty_like(w)
    for j in range(w.shape[0]):
        codes[j] = fp8_format.cast(w[j], scales[j])
        errors[j] = (w[j] - codes[j].float() * scales[j]) / u[j, j]
        w[j + 1 :] -= u[j, j + 1 :, None] * errors[j]
    return errors


def _block_kernel(w, scales, u, codes) -> torch.Tensor:  # as ``_block_loop``, in one launch
    from batchgen.kernels.gemm.gptq_block import round_block

    return round_block(w, scales, u, codes)


def quantize_rows(weight: torch.Tensor, hessian: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] -> (e4m3 [N, K], fp32 row scales [N]): the absmax scales of ``fp8_format.quantize_rows``,
    the codes by GPTQ where a Hessian was recorded, else rounded to nearest."""
    codes, scale = fp8_format.quantize_rows(weight)
    if hessian is None:
        return codes, scale
    return gptq_round(weight.to(hessian.device), scale.to(hessian.device), hessian).to(weight.device), scale
