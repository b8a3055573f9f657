"""The W8A16 product of ``--quantization fp8`` (``fp8_gemm.triton_fp8_matmul`` given a 16-bit input,
e4m3 weights widened tile by tile) against the torch reference (``fp8_format.linear_weight_only``). Off-GPU
under TRITON_INTERPRET=1 at tiny shapes; on a GPU at Llama-3-8B's shapes."""

from __future__ import annotations

import pytest
import torch

from batchgen.kernels import fp8_format as ref
from batchgen.kernels.gemm.dequant import dequantize
from batchgen.kernels.gemm.fp8_gemm import DEQUANT_ROWS, triton_fp8_matmul
from batchgen.kernels.gemm.split_sums import SplitSums, summed
from tests.kernels.cases import rel_error

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _operands(m: int, n: int, k: int, dtype: torch.dtype, seed: int):
    torch.manual_seed(seed)
    x = torch.randn(m, k, device=DEVICE).to(dtype)
    weight, scale = ref.quantize_rows(torch.randn(n, k, device=DEVICE) * 0.05)
    return x, weight, scale


@pytest.mark.parametrize("m", [1, 5, 70])  # 70: the large-M tiles (64-deep K)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_fp8_matmul_matches_reference(m, dtype):
    x, weight, scale = _operands(m, 80, 300, dtype, 3)  # K 300: a partial K tile
    got = triton_fp8_matmul(x, weight, scale, torch.float32)
    want = ref.linear_weight_only(x, weight, scale, torch.float32)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


def test_weight_only_split_k_partials_sum_to_the_product():
    """K split over programs: the partials come back unsummed when asked (for the next RMSNorm to add)."""
    x, weight, scale = _operands(3, 40, 1100, torch.float32, 4)  # 5 K tiles of 256
    want = ref.linear_weight_only(x, weight, scale, torch.float32)
    parts = triton_fp8_matmul(x, weight, scale, torch.float32, split_k=3, summed=False)
    assert isinstance(parts, SplitSums) and parts.partials.shape[0] == 3
    torch.testing.assert_close(summed(parts), want, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(triton_fp8_matmul(x, weight, scale, torch.float32, split_k=3), want,
                               rtol=1e-5, atol=1e-4)  # fmt: skip


def test_a_strided_input_is_read_as_its_values():
    x, weight, scale = _operands(4, 48, 192, torch.float32, 5)
    wide = torch.cat([x, x], dim=1)[:, ::2]  # a column stride of 2
    torch.testing.assert_close(triton_fp8_matmul(wide, weight, scale, torch.float32),
                               ref.linear_weight_only(wide, weight, scale, torch.float32), rtol=1e-5,
                               atol=1e-4)  # fmt: skip


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("m", [1, 32, 256, 4096])
@pytest.mark.parametrize(("n", "k"), [(6144, 4096), (4096, 14336)])  # Llama-3-8B's qkv and down_proj
def test_gpu_triton_fp8_matmul_matches_reference(m, n, k):
    x, weight, scale = _operands(m, n, k, torch.bfloat16, 6)
    want = ref.linear_weight_only(x, weight, scale, torch.float32)
    for dtype in (torch.bfloat16, torch.float16):
        assert rel_error(triton_fp8_matmul(x.to(dtype), weight, scale, dtype), want, m) < 5e-3


@pytest.mark.parametrize("split_k", [None, 3])
@pytest.mark.parametrize(("m", "n", "k"), [(32, 256, 512), (5, 200, 784), (64, 130, 1024)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tma_weight_only_product_matches_reference(m, n, k, split_k, dtype):
    """The TMA kernel given a 16-bit input: rows past M, a partial last column tile and K past the last
    full tile read as zeros; K split into partials summed or left to the consumer."""
    x, weight, scale = _operands(m, n, k, dtype, 9)
    got = triton_fp8_matmul(x, weight, scale, torch.float32, tma=True, split_k=split_k, block_n=64)
    torch.testing.assert_close(got, ref.linear_weight_only(x, weight, scale, torch.float32), rtol=1e-5,
                               atol=1e-4)  # fmt: skip
    parts = triton_fp8_matmul(x, weight, scale, torch.float32, tma=True, split_k=split_k, summed=False)
    assert isinstance(parts, SplitSums) == (split_k is not None)
    torch.testing.assert_close(summed(parts), got, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dequantized_weight_is_each_code_times_its_row_scale_rounded_once(dtype):
    _, weight, scale = _operands(1, 70, 300, dtype, 7)  # partial tiles both ways
    want = (weight.float() * scale.view(-1, 1)).to(dtype)
    got = dequantize(weight, scale, dtype)
    if dtype == torch.float32 or DEVICE == "cuda":
        assert torch.equal(got, want)
    else:  # Triton's interpreter casts fp32 to bf16 toward zero, not to nearest: within one bf16 step
        torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=0)


def test_prompt_sized_products_go_through_the_dequantized_weight():
    """From ``DEQUANT_ROWS`` rows the product is the widened weight's ``F.linear``; below, the kernel's
    (the same values either way, to rounding)."""
    x, weight, scale = _operands(DEQUANT_ROWS, 24, 40, torch.float32, 8)
    widened = torch.nn.functional.linear(x, dequantize(weight, scale, torch.float32))
    assert torch.equal(triton_fp8_matmul(x, weight, scale, torch.float32), widened)
    want = ref.linear_weight_only(x, weight, scale, torch.float32)
    torch.testing.assert_close(widened, want, rtol=1e-5, atol=1e-4)
    below = triton_fp8_matmul(x[:70], weight, scale, torch.float32)  # the kernel's 70-row tiles
    torch.testing.assert_close(below, want[:70], rtol=1e-5, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_dequantized_prompt_products():
    x, weight, scale = _operands(4096, 6144, 4096, torch.bfloat16, 9)
    assert torch.equal(
        dequantize(weight, scale, torch.bfloat16), (weight.float() * scale.view(-1, 1)).to(torch.bfloat16)
    )
    got = triton_fp8_matmul(x, weight, scale, torch.bfloat16)
    assert rel_error(got, ref.linear_weight_only(x, weight, scale, torch.float32), 4096) < 5e-3
