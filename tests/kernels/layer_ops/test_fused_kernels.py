"""Triton RMSNorm / rotary + KV write / SiLU-and-multiply against the torch reference (the oracle).

Off-GPU these run under TRITON_INTERPRET=1 (see conftest.py) at tiny shapes. bf16 results are compared
in bf16 ulps (the gap between neighbouring bf16 values: 8 significant bits, so 2**-8 to 2**-7 of the
value). The interpreter truncates fp32 -> bf16 where the GPU and torch round to nearest (up to one ulp
instead of half), at each point where the reference rounds:
- RMSNorm and SiLU-and-multiply round twice (the normalised / activated value, then the product):
  up to 3 ulps of the result (measured: 3).
- The residual sum rounds once: 1 ulp (measured: 1).
- Rotary output x*cos - y*sin cancels, so its error is relative to the rotated pair (x, y), whose
  magnitude the rotation keeps, not to the result: 2 ulps of the pair's magnitude (measured: 2), 4
  after the per-head norm's own rounding (measured: 4). V is copied to the cache untouched: exact.
On the GPU the kernels round like torch; test_bf16_fused_ops_round_like_torch_on_cuda holds them to that.
"""

from __future__ import annotations

import pytest
import torch

from batchgen.kernels import reference
from batchgen.kernels.layer_ops.activation import silu_mul
from batchgen.kernels.layer_ops.norm import rms_norm
from batchgen.kernels.layer_ops.rope import rope_write_kv

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FP32_TOL = dict(rtol=1e-5, atol=1e-5)
DTYPES = [torch.float32, torch.bfloat16]
ULPS = {"norm": 3, "silu": 3, "residual": 1, "rope": 2, "rope_qk_norm": 4}  # see the module docstring


def _bf16_ulp(magnitude: torch.Tensor) -> torch.Tensor:
    """bf16's gap between neighbours at each magnitude: 2**(e - 8) for a magnitude in [2**(e-1), 2**e)."""
    _, exp = torch.frexp(magnitude.float())
    return torch.ldexp(torch.ones_like(exp, dtype=torch.float32), exp - 8)


def _pair_magnitude(x: torch.Tensor) -> torch.Tensor:
    """|(x_i, x_partner)|: rotary mixes dimension i with i +- D/2, and a rotation keeps that length."""
    x = x.float()
    partner = torch.cat([x[..., x.shape[-1] // 2 :], x[..., : x.shape[-1] // 2]], -1)
    return torch.sqrt(x * x + partner * partner)


def _assert_close(got: torch.Tensor, want: torch.Tensor, kind: str, magnitude: torch.Tensor | None = None):
    """fp32: 1e-5. bf16: at most ULPS[kind] ulps at ``magnitude`` (default |want|)."""
    if want.dtype == torch.float32:
        torch.testing.assert_close(got, want, **FP32_TOL)
        return
    assert got.dtype == want.dtype and got.shape == want.shape
    scale = want.float().abs() if magnitude is None else magnitude
    ulps = ((got.float() - want.float()).abs() / _bf16_ulp(scale)).max().item()
    assert ulps <= ULPS[kind], f"{kind}: {ulps:.0f} bf16 ulps apart (allowed {ULPS[kind]})"


def _assert_rope_close(q, caches, ref_q, ref_caches, qk_norm: bool) -> None:
    kind = "rope_qk_norm" if qk_norm else "rope"
    _assert_close(q, ref_q, kind, _pair_magnitude(ref_q))
    _assert_close(caches[0], ref_caches[0], kind, _pair_magnitude(ref_caches[0]))
    assert torch.equal(caches[1], ref_caches[1])  # V: copied, not computed


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [64, 80])  # 80: a masked tail in the power-of-two block
def test_rms_norm_matches_reference(dtype, hidden):
    torch.manual_seed(0)
    x = torch.randn(5, hidden, device=DEVICE, dtype=dtype)
    weight = torch.randn(hidden, device=DEVICE, dtype=dtype)
    out, res = rms_norm(x, weight, 1e-6)
    ref, _ = reference.rms_norm(x, weight, 1e-6)
    _assert_close(out, ref, "norm")
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
    _assert_close(residual, ref_sum, "residual")
    _assert_close(out, ref, "norm")


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
    _assert_rope_close(q, caches, ref_q, ref_caches, qk_norm)


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
    _assert_close(silu_mul(x), reference.silu_mul(x), "silu")


def _fused_ops_case() -> dict[str, torch.Tensor]:
    qkv, positions, cos, sin, q_norm, k_norm, caches, slots = _rope_case(5, 4, 2, 64, torch.bfloat16, True)
    x = torch.randn(5, 256, device=DEVICE, dtype=torch.bfloat16)
    residual, weight = torch.randn_like(x), torch.randn(256, device=DEVICE, dtype=torch.bfloat16)
    gate_up = torch.randn(5, 512, device=DEVICE, dtype=torch.bfloat16)
    return dict(qkv=qkv, positions=positions, cos=cos, sin=sin, q_norm=q_norm, k_norm=k_norm,
                k_cache=caches[0], v_cache=caches[1], slots=slots, x=x, residual=residual, weight=weight,
                gate_up=gate_up)  # fmt: skip


def _fused_ops(t: dict[str, torch.Tensor]):
    """Rotary + KV write (q rotated in place in qkv), RMSNorm with the residual added in place, SiLU."""
    q = rope_write_kv(t["qkv"], t["positions"], t["cos"], t["sin"], t["q_norm"], t["k_norm"], 1e-6,
                      t["k_cache"], t["v_cache"], t["slots"], 4, 2)  # fmt: skip
    return q, rms_norm(t["x"], t["weight"], 1e-6, t["residual"])[0], silu_mul(t["gate_up"])


def _check_fused_ops(t: dict[str, torch.Tensor], initial: dict[str, torch.Tensor], outputs) -> None:
    """One application of the ops to ``initial`` (the inputs as they were), by the torch reference."""
    q, norm_out, act_out = outputs
    ref_caches = (initial["k_cache"].clone(), initial["v_cache"].clone())
    ref_q = reference.rope_write_kv(
        initial["qkv"].clone(), t["positions"], t["cos"], t["sin"], t["q_norm"], t["k_norm"], 1e-6,
        *ref_caches, t["slots"], 4, 2,
    )  # fmt: skip
    _assert_rope_close(q, (t["k_cache"], t["v_cache"]), ref_q, ref_caches, qk_norm=True)
    ref_norm, ref_sum = reference.rms_norm(initial["x"], t["weight"], 1e-6, initial["residual"].clone())
    _assert_close(t["residual"], ref_sum, "residual")
    _assert_close(norm_out, ref_norm, "norm")
    _assert_close(act_out, reference.silu_mul(initial["gate_up"]), "silu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_ops_capture_in_a_cuda_graph():
    """A replayed graph computes what the reference does: rotated q, the K/V written to their slots, the
    residual sum, the norm and the activation (not only finite values)."""
    t = _fused_ops_case()
    initial = {k: v.clone() for k, v in t.items() if v is not None}
    eager = [o.clone() for o in _fused_ops(t)]  # compiles outside the capture; updates t in place
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = _fused_ops(t)
    for name in ("qkv", "k_cache", "v_cache", "residual"):  # the in-place updates, undone
        t[name].copy_(initial[name])
    graph.replay()
    torch.cuda.synchronize()
    _check_fused_ops(t, initial, outputs)
    assert all(torch.equal(r, e) for r, e in zip(outputs, eager, strict=True))  # replay == eager launch


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
