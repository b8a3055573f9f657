"""Triton RMSNorm / rotary + KV write / SiLU-and-multiply against the torch reference (the oracle).

Off-GPU these run under TRITON_INTERPRET=1 (see conftest.py) at tiny shapes. The interpreter truncates
fp32 -> bf16 where the GPU and torch round to nearest, so bf16 comparisons allow about one bf16 ulp.
"""

from __future__ import annotations

import pytest
import torch

from batchgen.kernels import reference
from batchgen.kernels.activation import silu_mul
from batchgen.kernels.norm import rms_norm
from batchgen.kernels.rope import rope_write_kv

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=5e-2)}
DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [64, 80])  # 80: a masked tail in the power-of-two block
def test_rms_norm_matches_reference(dtype, hidden):
    torch.manual_seed(0)
    x = torch.randn(5, hidden, device=DEVICE, dtype=dtype)
    weight = torch.randn(hidden, device=DEVICE, dtype=dtype)
    out, res = rms_norm(x, weight, 1e-6)
    ref, _ = reference.rms_norm(x, weight, 1e-6)
    torch.testing.assert_close(out, ref, **TOL[dtype])
    assert res is x


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_adds_the_residual_in_place(dtype):
    torch.manual_seed(1)
    x = torch.randn(4, 64, device=DEVICE, dtype=dtype)
    residual = torch.randn(4, 64, device=DEVICE, dtype=dtype)
    weight = torch.randn(64, device=DEVICE, dtype=dtype)
    ref, ref_sum = reference.rms_norm(x, weight, 1e-5, residual.clone())
    out, new_residual = rms_norm(x, weight, 1e-5, residual)
    assert new_residual is residual  # updated in place: the next layer adds to it again
    torch.testing.assert_close(residual, ref_sum, **TOL[dtype])
    torch.testing.assert_close(out, ref, **TOL[dtype])


def _rope_case(tokens, q_heads, kv_heads, dim, dtype, qk_norm, seed=0):
    gen = torch.Generator().manual_seed(seed)
    width = (q_heads + 2 * kv_heads) * dim

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(DEVICE, dtype)

    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    freqs = torch.arange(64, dtype=torch.float32)[:, None] * inv_freq[None, :]
    cos, sin = freqs.cos().to(DEVICE, dtype), freqs.sin().to(DEVICE, dtype)
    norms = (rand(dim), rand(dim)) if qk_norm else (None, None)
    positions = torch.randint(0, 64, (tokens,), generator=gen).to(DEVICE)
    blocks = max(6, tokens // 4 + 2)
    slots = torch.randperm(blocks * 4, generator=gen)[:tokens].to(DEVICE)
    slots[-1] = -1  # a padding row: computed, never written to the cache
    caches = (rand(blocks, 4, kv_heads, dim), rand(blocks, 4, kv_heads, dim))  # [blocks, block_size, Hkv, D]
    return rand(tokens, width), positions, cos, sin, *norms, caches, slots


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize(("q_heads", "kv_heads", "dim"), [(4, 4, 16), (6, 2, 32), (8, 1, 16)])
def test_rope_write_kv_matches_reference(dtype, qk_norm, q_heads, kv_heads, dim):
    case = _rope_case(7, q_heads, kv_heads, dim, dtype, qk_norm)
    qkv, positions, cos, sin, q_norm, k_norm, caches, slots = case
    ref_caches = tuple(c.clone() for c in caches)
    ref_q = reference.rope_write_kv(
        qkv.clone(), positions, cos, sin, q_norm, k_norm, 1e-6, *ref_caches, slots, q_heads, kv_heads
    )
    q = rope_write_kv(qkv, positions, cos, sin, q_norm, k_norm, 1e-6, *caches, slots, q_heads, kv_heads)
    assert q.shape == (7, q_heads, dim) and q.data_ptr() == qkv.data_ptr()  # rotated in place
    torch.testing.assert_close(q, ref_q, **TOL[dtype])
    torch.testing.assert_close(caches[0], ref_caches[0], **TOL[dtype])
    torch.testing.assert_close(caches[1], ref_caches[1], **TOL[dtype])


def test_rope_padding_row_writes_nothing():
    qkv, positions, cos, sin, _, _, caches, slots = _rope_case(3, 2, 2, 16, torch.float32, False, seed=3)
    slots[:] = -1
    before = tuple(c.clone() for c in caches)
    rope_write_kv(qkv, positions, cos, sin, None, None, 1e-6, *caches, slots, 2, 2)
    assert torch.equal(caches[0], before[0]) and torch.equal(caches[1], before[1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inter", [48, 1100])  # 1100: two column blocks, the second one masked
def test_silu_mul_matches_reference(dtype, inter):
    torch.manual_seed(2)
    x = torch.randn(3, 2 * inter, device=DEVICE, dtype=dtype) * 3
    torch.testing.assert_close(silu_mul(x), reference.silu_mul(x), **TOL[dtype])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_ops_capture_in_a_cuda_graph():
    qkv, positions, cos, sin, q_norm, k_norm, caches, slots = _rope_case(5, 4, 2, 64, torch.bfloat16, True)
    x = torch.randn(5, 256, device=DEVICE, dtype=torch.bfloat16)
    residual, weight = torch.randn_like(x), torch.randn(256, device=DEVICE, dtype=torch.bfloat16)
    gate_up = torch.randn(5, 512, device=DEVICE, dtype=torch.bfloat16)

    def body():
        rope_write_kv(qkv, positions, cos, sin, q_norm, k_norm, 1e-6, *caches, slots, 4, 2)
        return rms_norm(x, weight, 1e-6, residual)[0], silu_mul(gate_up)

    body()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        norm_out, act_out = body()
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(act_out, reference.silu_mul(gate_up), **TOL[torch.bfloat16])
    assert torch.isfinite(norm_out).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("qk_norm", [False, True])
def test_bf16_fused_ops_round_like_torch_on_cuda(qk_norm):
    """On the GPU the kernels round where transformers' torch ops round (no FMA across a rounding):
    bit-identical rotary, norm and activation outputs (the per-head norm's rsqrt may differ by an ulp)."""
    torch.manual_seed(0)
    case = _rope_case(256, 32, 8, 128, torch.bfloat16, qk_norm, seed=5)
    qkv, positions, cos, sin, q_norm, k_norm, caches, slots = case
    ref_caches = tuple(c.clone() for c in caches)
    ref_q = reference.rope_write_kv(
        qkv.clone(), positions, cos, sin, q_norm, k_norm, 1e-6, *ref_caches, slots, 32, 8
    )
    q = rope_write_kv(qkv, positions, cos, sin, q_norm, k_norm, 1e-6, *caches, slots, 32, 8)
    for got, want in ((q, ref_q), (caches[0], ref_caches[0]), (caches[1], ref_caches[1])):
        mismatch = (got != want).float().mean().item()
        assert mismatch <= (1e-3 if qk_norm else 0.0), f"{mismatch:.2%} of elements differ"
    x, residual = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16), None
    weight = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    residual = torch.randn_like(x)
    ref, ref_sum = reference.rms_norm(x, weight, 1e-5, residual.clone())
    out, _ = rms_norm(x, weight, 1e-5, residual)
    assert torch.equal(residual, ref_sum) and (out != ref).float().mean().item() <= 1e-3
    gate_up = torch.randn(64, 2 * 3072, device="cuda", dtype=torch.bfloat16) * 3
    assert (silu_mul(gate_up) != reference.silu_mul(gate_up)).float().mean().item() <= 1e-3
