"""The CUDA FP8 decode matmul (``fp8_gemv.cu``) against the fp32 reference (e4m3 products are exact in
fp32: only the order of the sums and the output's rounding differ). GPU only (sm_90: TMA, wgmma)."""

from __future__ import annotations

import pytest
import torch

from batchgen.kernels import fp8_gemv_cuda
from batchgen.kernels import fp8_reference as ref
from batchgen.kernels.fp8_gemm import rowwise_matmul, triton_fp8_matmul
from batchgen.kernels.fp8_reference import ActQuant, Fp8Act

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0), reason="needs sm_90"
    ),
]
SHAPES = [fp8_gemv_cuda.DEFAULT_SHAPE, fp8_gemv_cuda.FEW_PROGRAMS_SHAPE, fp8_gemv_cuda.GemvShape(2, 3)]


def _problem(m: int, n: int, k: int, seed: int = 0, act_stride: int | None = None):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn((m, act_stride or k), device="cuda", generator=gen)[:, :k]
    act = ref.quantize_act(x, ActQuant())
    if act_stride:  # the e4m3 rows as a view with a longer row stride (a slice of a fused buffer)
        wide = torch.zeros((m, act_stride), device="cuda", dtype=ref.FP8)
        wide[:, :k] = act.data
        act = Fp8Act(wide[:, :k], act.scale)
    weight, scale = ref.quantize_rows(torch.randn((n, k), device="cuda", generator=gen) * 0.05)
    return act, weight, scale


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=1e-2 * want.abs().max().item())


@pytest.mark.parametrize("m", [1, 7, 16, 32])
@pytest.mark.parametrize("n,k", [(32, 128), (50, 48), (1000, 4096), (96, 14336), (64, 2000)])
@pytest.mark.parametrize("shape", SHAPES)
def test_gemv_matches_reference(m, n, k, shape):
    """Partial programs (N % 32), partial chunks (K % 128), one chunk (K = 48), fewer chunks than slots,
    M < 32 (rows 32-63 of wgmma's M are zeros either way)."""
    act, weight, scale = _problem(m, n, k)
    assert fp8_gemv_cuda.supports(act, weight, scale, torch.bfloat16)
    got = fp8_gemv_cuda.matmul(act, weight, scale, torch.bfloat16, shape)
    _close(got, ref.linear_rows(act, weight, scale, torch.float32))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gemv_output_dtypes_and_strided_activations(dtype):
    act, weight, scale = _problem(32, 4096, 4096, seed=1, act_stride=6144)
    assert act.data.stride(0) == 6144
    got = fp8_gemv_cuda.matmul(act, weight, scale, dtype)
    assert got.dtype == dtype
    _close(got, ref.linear_rows(act, weight, scale, torch.float32))


def test_rowwise_matmul_takes_it_at_decode_sizes_and_agrees_with_triton():
    act, weight, scale = _problem(32, 6144, 4096, seed=2)
    cuda = rowwise_matmul(act, weight, scale, torch.bfloat16)
    triton = triton_fp8_matmul(act, weight, scale, torch.bfloat16)
    torch.testing.assert_close(cuda, triton, rtol=1e-2, atol=1e-2)


def test_gemv_in_a_cuda_graph():
    """Captured once, replayed after the activations and their scales change in place."""
    act, weight, scale = _problem(32, 4096, 4096, seed=3)
    fp8_gemv_cuda.matmul(act, weight, scale, torch.bfloat16)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fp8_gemv_cuda.matmul(act, weight, scale, torch.bfloat16)
    fresh, _, _ = _problem(32, 4096, 4096, seed=4)
    act.data.copy_(fresh.data)
    act.scale.copy_(fresh.scale)
    graph.replay()
    torch.cuda.synchronize()
    _close(out, ref.linear_rows(act, weight, scale, torch.float32))


def test_supports_only_what_the_kernel_reads():
    act, weight, scale = _problem(33, 64, 128)
    assert not fp8_gemv_cuda.supports(act, weight, scale, torch.bfloat16)  # more rows than a box
    act, weight, scale = _problem(8, 64, 128)
    assert not fp8_gemv_cuda.supports(act, weight, scale, torch.float32)  # bf16 / fp16 out only
    assert not fp8_gemv_cuda.supports(act, weight[:63], scale[:63], torch.bfloat16)  # odd N
    odd = Fp8Act(act.data[:, :120], act.scale)
    assert not fp8_gemv_cuda.supports(odd, weight[:, :120], scale, torch.bfloat16)  # K % 16 != 0
