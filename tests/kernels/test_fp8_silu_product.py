"""SiLU-and-multiply in the FP8 gate|up product's epilogue (``fp8_gemm_tma.silu_mul_product``, the TMA
kernel at decode sizes), which hands on h with its per-block maxima (a ``MaximaAct``), quantized per row
by one launch (``activation.quantize_by_maxima``) or by the next TMA product as it loads it: the same e4m3
bits and scales as the product stored, then ``silu_mul``, and the same product after it. Off-GPU under
TRITON_INTERPRET=1 at tiny shapes (``force`` / ``tma=True``: the TMA kernels run in the interpreter)."""

from __future__ import annotations

import pytest
import torch

from batchgen.kernels import fp8_gemm_tma
from batchgen.kernels import fp8_reference as ref
from batchgen.kernels.activation import quantize_by_maxima, silu_mul
from batchgen.kernels.fp8_gemm import triton_fp8_matmul
from batchgen.kernels.fp8_quant import quantize_act
from batchgen.kernels.fp8_reference import ActQuant
from tests.kernels.test_fp8_kernels import _same

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize(("m", "inter", "k"), [(32, 128, 512), (5, 100, 784)])  # 100: a partial last tile
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gate_up_product_with_silu_equals_product_then_silu(m, inter, k, dtype):
    """SiLU-and-multiply in the gate|up TMA kernel's epilogue, then one quantizing launch from its
    per-block maxima: the same e4m3 bits and scales as the product stored, then ``silu_mul``."""
    torch.manual_seed(10)
    act = ref.quantize_act(torch.randn(m, k, device=DEVICE), ActQuant())
    weight, scale = ref.quantize_rows(torch.randn(2 * inter, k, device=DEVICE))
    got = fp8_gemm_tma.silu_mul_product(act, weight, scale, dtype, force=True)
    want = silu_mul(triton_fp8_matmul(act, weight, scale, dtype, tma=True), ActQuant())
    _same(quantize_by_maxima(*got), want)


@pytest.mark.parametrize("split_k", [None, 2])
@pytest.mark.parametrize("tma", [True, False])
def test_down_product_quantizing_h_as_it_loads_it_changes_no_bit(split_k, tma):
    """down_proj over the SiLU product's h and maxima: the TMA kernel quantizes each tile per row as it
    loads it (the pointer kernel gets it quantized first); the same bits as over the quantized h."""
    torch.manual_seed(11)
    m, inter, k, n = 5, 160, 512, 96  # h: [5, 160], 3 blocks of maxima (the last partial), 1 K tile
    act = ref.quantize_act(torch.randn(m, k, device=DEVICE), ActQuant())
    weight, scale = ref.quantize_rows(torch.randn(2 * inter, k, device=DEVICE))
    h = fp8_gemm_tma.silu_mul_product(act, weight, scale, torch.bfloat16, force=True)
    assert h.maxima.shape == (m, 3)
    down, down_scale = ref.quantize_rows(torch.randn(n, inter, device=DEVICE))
    kw = dict(tma=tma, split_k=split_k, summed=True)
    got = triton_fp8_matmul(h, down, down_scale, torch.bfloat16, **kw)
    want = triton_fp8_matmul(quantize_by_maxima(*h), down, down_scale, torch.bfloat16, **kw)
    assert got.isfinite().all() and torch.equal(got, want)


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
    got = fp8_gemm_tma.silu_mul_product(act, wq, ws, torch.bfloat16)
    assert got is not None, "the fused kernel should apply here"
    _same(quantize_by_maxima(*got), silu_mul(triton_fp8_matmul(act, wq, ws, torch.bfloat16), ActQuant()))
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.cuda.graph(graph):
        captured = fp8_gemm_tma.silu_mul_product(act, wq, ws, torch.bfloat16)
    fresh = quantize_act(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), ActQuant())
    act.data.copy_(fresh.data)
    act.scale.copy_(fresh.scale)
    graph.replay()
    want = silu_mul(triton_fp8_matmul(fresh, wq, ws, torch.bfloat16), ActQuant())
    _same(quantize_by_maxima(*captured), want)
