"""The W8A16 product of ``--quantization fp8`` (``fp8_gemm.triton_fp8_matmul`` given a 16-bit input,
e4m3 weights widened tile by tile) against the torch reference (``fp8_format.linear_weight_only``). Off-GPU
under TRITON_INTERPRET=1 at tiny shapes; on a GPU at Llama-3-8B's shapes."""

from __future__ import annotations

import pytest
import torch

from batchgen.kernels import fp8_format as ref
from batchgen.kernels.gemm.fp8_gemm import triton_fp8_matmul
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
