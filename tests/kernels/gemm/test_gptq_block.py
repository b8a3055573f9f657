"""GPTQ's block kernel (``kernels/gemm/gptq_block.py``) against the torch loop it replaces on CUDA
(``gptq._block_loop``): the same e4m3 codes bit for bit. Off-GPU under TRITON_INTERPRET=1 at small
shapes; on a GPU at a Llama-3-8B projection's K."""

from __future__ import annotations

import pytest
import torch

from batchgen.kernels import fp8_format
from batchgen.model.weights.gptq import gptq_round

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _problem(n: int, k: int, seed: int):
    torch.manual_seed(seed)
    weight = torch.randn(n, k, device=DEVICE) * 0.05
    x = torch.randn(4 * k, k, device=DEVICE) @ torch.randn(k, k, device=DEVICE) * 0.3  # correlated inputs
    return weight, x.T @ x


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize(("n", "k"), [(70, 300), (33, 130), (5, 16)])  # partial last blocks and programs
@pytest.mark.parametrize("act_order", [True, False])
def test_block_kernel_gives_the_loops_codes(n, k, act_order):
    weight, hessian = _problem(n, k, 1)
    scale = fp8_format.quantize_rows(weight)[1]
    loop = gptq_round(weight, scale, hessian, act_order, kernel=False)
    assert _same_bits(gptq_round(weight, scale, hessian, act_order, kernel=True), loop)
    assert not _same_bits(loop, fp8_format.cast(weight, scale.view(-1, 1)))  # GPTQ moved some codes


def test_block_kernel_takes_a_scale_per_weight():
    """Per-row-per-group layouts expand their scales to one per weight ([N, K])."""
    weight, hessian = _problem(40, 260, 2)
    scale = fp8_format.quantize_blocks(weight, 1, 128)[1].repeat_interleave(128, dim=1)[:, :260]
    loop = gptq_round(weight, scale, hessian, kernel=False)
    assert _same_bits(gptq_round(weight, scale, hessian, kernel=True), loop)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_block_kernel_gives_the_loops_codes():
    weight, hessian = _problem(1024, 4096, 3)
    scale = fp8_format.quantize_rows(weight)[1]
    loop = gptq_round(weight, scale, hessian, kernel=False)
    assert _same_bits(gptq_round(weight, scale, hessian), loop)  # the kernel: CUDA's default
