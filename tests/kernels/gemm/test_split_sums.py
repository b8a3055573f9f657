"""Split-K partial products handed on unsummed (``kernels/gemm/split_sums.py``): the FP8 product returns them,
RMSNorm (with its residual add) and rotary + KV write add them. Each consumer must see exactly the
summed product: its outputs equal, bit for bit, those from the product summed by the summing kernel.
Off-GPU under TRITON_INTERPRET=1 at tiny shapes."""

from __future__ import annotations

import pytest
import torch

from batchgen.kernels import fp8_format as ref
from batchgen.kernels.fp8_format import ActQuant
from batchgen.kernels.gemm.fp8_gemm import triton_fp8_matmul
from batchgen.kernels.gemm.split_sums import SplitSums, summed
from batchgen.kernels.layer_ops.norm import rms_norm
from batchgen.kernels.layer_ops.rope import rope_write_kv

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _partials(splits: int, rows: int, cols: int, dtype: torch.dtype) -> SplitSums:
    # fp32 partials whose sums round differently in the model dtype than any one of them
    return SplitSums(torch.randn(splits, rows, cols, device=DEVICE) * 3, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_product_hands_on_its_partials(dtype):
    torch.manual_seed(1)
    act = ref.quantize_act(torch.randn(3, 1100, device=DEVICE), ActQuant())
    weight, scale = ref.quantize_rows(torch.randn(40, 1100, device=DEVICE))
    parts = triton_fp8_matmul(act, weight, scale, dtype, split_k=3, summed=False)
    assert isinstance(parts, SplitSums) and parts.partials.shape == (3, 3, 40) and parts.shape == (3, 40)
    assert torch.equal(summed(parts), triton_fp8_matmul(act, weight, scale, dtype, split_k=3))
    # one split: nothing to add, a tensor either way
    one = triton_fp8_matmul(act, weight, scale, dtype, split_k=1, summed=False)
    assert isinstance(one, torch.Tensor) and torch.equal(one, triton_fp8_matmul(act, weight, scale, dtype))


@pytest.mark.parametrize("quant", [None, ActQuant(None), ActQuant(32)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_adds_partials_to_its_residual(quant, dtype):
    torch.manual_seed(2)
    parts = _partials(2, 5, 96, dtype)
    weight = torch.rand(96, device=DEVICE).to(dtype) + 0.5
    residual = torch.randn(5, 96, device=DEVICE).to(dtype)
    got_res, want_res = residual.clone(), residual.clone()
    got, _ = rms_norm(parts, weight, 1e-6, got_res, quant)
    want, _ = rms_norm(summed(parts), weight, 1e-6, want_res, quant)
    assert torch.equal(got_res, want_res)
    if quant is None:
        assert got.dtype == dtype and torch.equal(got, want)
    else:
        assert torch.equal(got.data.view(torch.uint8), want.data.view(torch.uint8))
        assert torch.equal(got.scale, want.scale)


@pytest.mark.parametrize("qk_norm", [False, True])  # Qwen3's per-head norms
@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, ref.FP8])
def test_rotary_adds_qkv_partials(cache_dtype, qk_norm):
    torch.manual_seed(3)
    tokens, q_heads, kv_heads, dim = 6, 4, 2, 32
    parts = _partials(3, tokens, (q_heads + 2 * kv_heads) * dim, torch.bfloat16)
    freqs = torch.arange(16.0)[:, None] * (1.0 / 10000 ** (torch.arange(0, dim, 2) / dim))[None, :]
    cos, sin = freqs.cos().to(DEVICE, torch.bfloat16), freqs.sin().to(DEVICE, torch.bfloat16)
    positions = torch.tensor([0, 3, 4, 9, 15, 2], device=DEVICE)
    slots = torch.tensor([5, 0, 11, 3, 7, -1], device=DEVICE)
    caches = [torch.zeros(4, 4, kv_heads, dim, dtype=cache_dtype, device=DEVICE) for _ in range(2)]
    want_caches = [c.clone() for c in caches]
    norms = [torch.rand(dim, device=DEVICE).to(torch.bfloat16) + 0.5 if qk_norm else None for _ in range(2)]
    args = (positions, cos, sin, *norms, 1e-6)
    qkv = summed(parts)
    want = rope_write_kv(qkv, *args, *want_caches, slots, q_heads, kv_heads, (0.5, 2.0))
    got = rope_write_kv(parts, *args, *caches, slots, q_heads, kv_heads, (0.5, 2.0))
    assert got.shape == want.shape == (tokens, q_heads, dim) and torch.equal(got, want)
    for a, b in zip(caches, want_caches, strict=True):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_forward_with_partials_changes_no_bit(tmp_path, monkeypatch):
    """A small FP8 model's prompt chunks and decode steps: the same logits, bit for bit, whether its
    decode-sized products reach rotary and RMSNorm as partials or summed by the summing kernel."""
    from batchgen.kernels.gemm import fp8_gemm
    from tests.kernels.fp8_forward import fp8_forward_logits

    handed_on = []
    product = fp8_gemm.rowwise_matmul

    def counting(*args, summed=True):
        out = product(*args, summed=summed)
        handed_on.append(isinstance(out, SplitSums))
        return out

    monkeypatch.setattr(fp8_gemm, "rowwise_matmul", counting)
    fp8_forward_logits(str(tmp_path / "partials.pt"))
    assert any(handed_on), "no product was handed on as partials: the test would prove nothing"
    monkeypatch.setattr(fp8_gemm, "rowwise_matmul", lambda *args, summed=True: product(*args, summed=True))
    fp8_forward_logits(str(tmp_path / "summed.pt"))
    with_partials, without = torch.load(tmp_path / "partials.pt"), torch.load(tmp_path / "summed.pt")
    assert with_partials.isfinite().all() and torch.equal(with_partials, without)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_forward_with_silu_in_the_product_changes_no_bit(tmp_path, monkeypatch):
    """The same forward with an MLP wide enough for gate|up's TMA kernel (2 x 8704 rows: 136 tiles of 128
    columns, >= the 132 SMs of the largest parts): the same logits whether SiLU-and-multiply runs in the
    product's epilogue (``gate_up_silu.silu_mul_product``) or after it."""
    from batchgen.kernels.gemm import fp8_gemm_tma
    from batchgen.kernels.layer_ops import gate_up_silu
    from tests.kernels.fp8_forward import fp8_forward_logits

    device = torch.cuda.current_device()
    if gate_up_silu.num_sms(torch.device("cuda", device)) > 136 or not fp8_gemm_tma.device_has_tma(device):
        pytest.skip("needs a GPU with TMA and at most 136 SMs (the gate|up kernel at this width)")
    applied = []
    product = gate_up_silu.silu_mul_product

    def counting(*args, **kwargs):
        out = product(*args, **kwargs)
        applied.append(out is not None)
        return out

    monkeypatch.setattr(gate_up_silu, "silu_mul_product", counting)
    fp8_forward_logits(str(tmp_path / "fused.pt"), intermediate=8704)
    assert any(applied), "SiLU never ran in the product: the test would prove nothing"
    monkeypatch.setattr(gate_up_silu, "silu_mul_product", lambda *args, **kwargs: None)
    fp8_forward_logits(str(tmp_path / "after.pt"), intermediate=8704)
    fused, after = torch.load(tmp_path / "fused.pt"), torch.load(tmp_path / "after.pt")
    assert fused.isfinite().all() and torch.equal(fused, after)
