"""The CPU path's rotary + KV write against the torch reference: bit-identical, not merely close."""

from __future__ import annotations

import pytest
import torch

from batchgen.kernels import reference
from batchgen.kernels.cpu import cpu_rotary
from batchgen.model.backends import TorchBackend


def _case(tokens: int, q_heads: int, kv_heads: int, dim: int, dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(tokens, (q_heads + 2 * kv_heads) * dim, generator=gen).to(dtype)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    freqs = torch.arange(200, dtype=torch.float32)[:, None] * inv_freq[None, :]
    positions = torch.randint(0, 200, (tokens,), generator=gen)
    blocks = tokens // 4 + 3
    slots = torch.randperm(blocks * 4, generator=gen)[:tokens]
    caches = [torch.randn(blocks, 4, kv_heads, dim, generator=gen).to(dtype) for _ in range(2)]
    return qkv, positions, freqs.cos().to(dtype), freqs.sin().to(dtype), slots, caches


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("q_heads", "kv_heads", "dim"), [(9, 3, 64), (4, 4, 16), (8, 1, 32)])
@pytest.mark.parametrize("padding", [0, 2])
def test_bit_identical_to_the_reference(dtype, q_heads, kv_heads, dim, padding):
    qkv, positions, cos, sin, slots, caches = _case(11, q_heads, kv_heads, dim, dtype, seed=q_heads)
    if padding:
        slots[-padding:] = -1  # padding rows: rotated, never written
    want_caches = [c.clone() for c in caches]
    want = reference.rope_write_kv(
        qkv.clone(), positions, cos, sin, None, None, 1e-6, *want_caches, slots, q_heads, kv_heads
    )
    plan = cpu_rotary.plan_rotary(positions, cos, sin, slots)
    assert (plan.rows is None) == (padding == 0)
    got = cpu_rotary.rope_write_kv(qkv, plan, *caches, q_heads, kv_heads)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert torch.equal(got, want)
    assert torch.equal(caches[0], want_caches[0]) and torch.equal(caches[1], want_caches[1])


def test_the_backend_plans_once_per_step_and_keeps_the_oracle_for_qk_norms(monkeypatch):
    made = []
    real = cpu_rotary.plan_rotary
    monkeypatch.setattr(cpu_rotary, "plan_rotary", lambda *a: made.append(a) or real(*a))
    backend = TorchBackend()
    qkv, positions, cos, sin, slots, caches = _case(6, 4, 2, 16, torch.float32)
    for step_positions in (positions, positions.clone()):  # two steps of three layers
        for _ in range(3):
            backend.rope_write_kv(qkv, step_positions, cos, sin, None, None, 1e-6, *caches, slots, 4, 2)
    assert len(made) == 2
    norm = torch.ones(16)
    want_caches = [c.clone() for c in caches]
    want = reference.rope_write_kv(qkv, positions, cos, sin, norm, norm, 1e-6, *want_caches, slots, 4, 2)
    got = backend.rope_write_kv(qkv, positions, cos, sin, norm, norm, 1e-6, *caches, slots, 4, 2)
    assert torch.equal(got, want) and torch.equal(caches[0], want_caches[0])
