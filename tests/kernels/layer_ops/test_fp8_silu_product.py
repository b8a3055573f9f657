"""SiLU-and-multiply in the FP8 gate|up product's epilogue (``gate_up_silu.silu_mul_product``, the TMA kernel
at decode sizes), then one quantizing launch from its per-block maxima (``activation.
quantize_by_maxima``): the same e4m3 bits and scales as the product stored, then ``silu_mul``. Off-GPU
under TRITON_INTERPRET=1 at tiny shapes (``force``: the TMA kernel runs in the interpreter)."""

from __future__ import annotations

import pytest
import torch

from batchgen.kernels import fp8_format as ref
from batchgen.kernels.fp8_format import ActQuant
from batchgen.kernels.gemm.fp8_gemm import triton_fp8_matmul
from batchgen.kernels.gemm.fp8_quant import quantize_act
from batchgen.kernels.layer_ops import gate_up_silu
from batchgen.kernels.layer_ops.activation import silu_mul
from tests.kernels.cases import same_fp8

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize(("m", "inter", "k"), [(32, 128, 512), (5, 100, 784)])  # 100: a partial last tile
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gate_up_product_with_silu_equals_product_then_silu(m, inter, k, dtype):
    """SiLU-and-multiply in the gate|up TMA kernel's epilogue, then one quantizing launch from its
    per-block maxima: the same e4m3 bits and scales as the product stored, then ``silu_mul``."""
    torch.manual_seed(10)
    act = ref.quantize_act(torch.randn(m, k, device=DEVICE), ActQuant())
    weight, scale = ref.quantize_rows(torch.randn(2 * inter, k, device=DEVICE))
    got = gate_up_silu.silu_mul_product(act, weight, scale, dtype, force=True)
    want = silu_mul(triton_fp8_matmul(act, weight, scale, dtype, tma=True), ActQuant())
    same_fp8(got, want)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("m", [1, 17, 32, 64])
def test_gpu_gate_up_silu_product_equals_product_then_silu(m):
    """Llama-3-8B's gate|up with SiLU in the TMA kernel's epilogue (the default at decode sizes on
    Hopper), against the product stored, then ``silu_mul``: the same bits, also replayed from a graph."""
    torch.manual_seed(3)
    inter, k = 14336, 4096
    act = quantize_act(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), ActQuant())
    wq, ws = ref.quantize_rows(torch.randn(2 * inter, k, device="cuda", dtype=torch.bfloat16) * 0.02)
    got = gate_up_silu.silu_mul_product(act, wq, ws, torch.bfloat16)
    assert got is not None, "the fused kernel should apply here"
    same_fp8(got, silu_mul(triton_fp8_matmul(act, wq, ws, torch.bfloat16), ActQuant()))
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.cuda.graph(graph):
        captured = gate_up_silu.silu_mul_product(act, wq, ws, torch.bfloat16)
    fresh = quantize_act(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), ActQuant())
    act.data.copy_(fresh.data)
    act.scale.copy_(fresh.scale)
    graph.replay()
    same_fp8(captured, silu_mul(triton_fp8_matmul(fresh, wq, ws, torch.bfloat16), ActQuant()))


@pytest.mark.parametrize(("m", "inter", "k"), [(32, 128, 512), (5, 100, 784)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_weight_only_gate_up_product_with_silu_equals_product_then_silu(m, inter, k, dtype):
    """Weight-only (a 16-bit input): the epilogue's h, in the model dtype, is the TMA product stored,
    then ``silu_mul``, bit for bit."""
    torch.manual_seed(11)
    x = torch.randn(m, k, device=DEVICE).to(dtype)
    weight, scale = ref.quantize_rows(torch.randn(2 * inter, k, device=DEVICE))
    got = gate_up_silu.silu_mul_product(x, weight, scale, dtype, force=True)
    assert got.dtype == dtype and got.shape == (m, inter)
    want = silu_mul(triton_fp8_matmul(x, weight, scale, dtype, tma=True))
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("m", [1, 32, 64])
def test_gpu_weight_only_gate_up_silu_product_equals_product_then_silu(m):
    torch.manual_seed(4)
    x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
    wq, ws = ref.quantize_rows(torch.randn(2 * 14336, 4096, device="cuda", dtype=torch.bfloat16) * 0.02)
    got = gate_up_silu.silu_mul_product(x, wq, ws, torch.bfloat16, force=True)
    want = silu_mul(triton_fp8_matmul(x, wq, ws, torch.bfloat16, tma=True))
    torch.testing.assert_close(got, want, rtol=0, atol=0)
