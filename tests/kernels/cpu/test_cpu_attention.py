"""The CPU path's paged attention against the torch reference (the oracle): decodes split by block,
prefill chunks through SDPA, in every mix, with GQA, sliding windows and graph-padding rows."""

from __future__ import annotations

import pytest
import torch

from batchgen.kernels import reference
from batchgen.kernels.cpu import cpu_attention
from batchgen.model.backends import PagedContext, TorchBackend
from tests.kernels.cases import make_case, rel_error

GQA = [(4, 4), (9, 3), (8, 2), (8, 1)]  # group sizes 1, 3 (SmolLM2's 9/3), 4 and 8


def _check(case, tol: float = 1e-5) -> torch.Tensor:
    ref = reference.paged_attention(*case.attn_args())
    out = cpu_attention.paged_attention(*case.attn_args())
    assert out.shape == ref.shape and out.dtype == ref.dtype
    err = rel_error(out, ref, case.num_valid_rows)
    assert err < tol, f"relative error {err:.2e} >= {tol:.0e}"
    assert not out[case.num_valid_rows :].any()  # graph-padding rows stay zero
    return out


def paged_context(case) -> PagedContext:
    """A new step's context over the case's tensors (the backend keys its plans on the object)."""
    return PagedContext([], case.slot_mapping, case.cu_seqlens_q, case.seq_lens, case.block_tables,
                        case.max_q_len, case.max_seq_len, None)  # fmt: skip


@pytest.mark.parametrize(("q_heads", "kv_heads"), GQA)
def test_decodes_of_ragged_contexts(q_heads, kv_heads):
    # A 1-token context, partial and exactly full last blocks, and one context far longer than the rest.
    case = make_case([1] * 6, [1, 15, 16, 17, 40, 300], q_heads=q_heads, kv_heads=kv_heads, head_dim=16,
                     pad_rows=2, seed=q_heads)  # fmt: skip
    _check(case)


@pytest.mark.parametrize(("q_heads", "kv_heads"), GQA)
def test_prefill_chunks_after_cached_context(q_heads, kv_heads):
    # A whole prompt, a chunk after 20 cached tokens, and a chunk that fills its block exactly.
    case = make_case([9, 12, 16], [9, 32, 48], q_heads=q_heads, kv_heads=kv_heads, head_dim=16, seed=7)
    _check(case)


@pytest.mark.parametrize("window", [1, 5, 16, 24, 1000])
def test_sliding_window(window):
    # Windows inside one block, across blocks, of exactly one block, and longer than any context.
    case = make_case([1, 7, 1, 1, 20], [3, 30, 50, 97, 97], q_heads=8, kv_heads=2, head_dim=16,
                     sliding_window=window, pad_rows=1, seed=window)  # fmt: skip
    _check(case)


@pytest.mark.parametrize("block_size", [1, 8, 32])
def test_mixed_step_block_sizes(block_size):
    """Decodes and prefill chunks interleaved in one step, as continuous batching packs them."""
    case = make_case([1, 5, 1, 1, 3, 1], [60, 5, 2, 33, 40, 128], q_heads=6, kv_heads=3, head_dim=32,
                     block_size=block_size, pad_rows=3, seed=block_size)  # fmt: skip
    _check(case)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_16_bit_cache_multiplies_in_its_own_dtype(dtype):
    """Products in the cache's dtype (fp32 accumulation, softmax and merge): within bf16's rounding of
    the fp32 reference, here with scores large enough (q x 4) for that rounding to show."""
    case = make_case([1, 4, 1, 1], [20, 20, 70, 300], q_heads=4, kv_heads=2, head_dim=16, dtype=dtype)
    case.query.mul_(4)
    out = _check(case, tol=2e-2)
    assert out.dtype == dtype
    assert cpu_attention.compute_dtype(case.k_cache) == dtype


def test_decode_plan_reads_only_each_sequences_own_blocks():
    """The work follows each context: a 300-token sequence in the batch adds its own 19 blocks, it does
    not make the short decodes read 19 blocks each (as padding to the longest would)."""
    case = make_case([1] * 4, [5, 17, 40, 300], q_heads=4, kv_heads=2, head_dim=16)
    plan = cpu_attention.plan_decode(case.seq_lens, case.block_tables, 16, None)
    assert len(plan.blocks) == 1 + 2 + 3 + 19
    assert plan.seq.tolist() == [0] + [1] * 2 + [2] * 3 + [3] * 19
    for b, n in enumerate([1, 2, 3, 19]):
        assert plan.blocks[plan.seq == b].tolist() == case.block_tables[b, :n].tolist()
    windowed = cpu_attention.plan_decode(case.seq_lens, case.block_tables, 16, 24)
    assert len(windowed.blocks) == 1 + 2 + 2 + 2  # only the blocks inside each window


def test_the_cpu_backend_plans_once_per_step(monkeypatch):
    """Every layer of a step reads the same blocks: one plan per step (and window), then a new one."""
    made = []
    real = cpu_attention.plan_step
    monkeypatch.setattr(cpu_attention, "plan_step", lambda *a: made.append(a) or real(*a))
    backend = TorchBackend()
    case = make_case([1, 3], [20, 40], q_heads=4, kv_heads=2, head_dim=16)
    want = reference.paged_attention(*case.attn_args())
    for ctx in (paged_context(case), paged_context(case)):  # two steps
        for window in (None, None, 8, None):  # four layers, one with a sliding window
            out = backend.attention(case.query, case.k_cache, case.v_cache, ctx, case.scale, window)
            if window is None:
                assert rel_error(out, want, case.num_valid_rows) < 1e-5
    assert len(made) == 4  # (step, window): 2 x 2


def test_a_decode_step_returns_the_decodes_without_a_scatter():
    """A step of decodes only (row b is sequence b), its query a strided view as the rotary op returns
    it: the decodes' output is the whole output, as the reference computes it."""
    case = make_case([1] * 5, [1, 16, 17, 40, 300], q_heads=9, kv_heads=3, head_dim=16, seed=5)
    fused = torch.cat([case.query, torch.randn(5, 3, 16)], dim=1)  # [T, Hq + Hkv, D]: q heads first
    query = fused[:, :9]
    assert not query.is_contiguous()
    args = list(case.attn_args())
    args[0] = query
    plan = cpu_attention.plan_step(case.cu_seqlens_q, case.seq_lens, case.block_tables, 16, None)
    assert plan.decodes_only
    out = cpu_attention.paged_attention(*args)
    assert rel_error(out, reference.paged_attention(*case.attn_args()), 5) < 1e-5


@pytest.mark.parametrize("window", [None, 6, 40])
@pytest.mark.parametrize(("q_heads", "kv_heads"), [(9, 3), (4, 4)])
def test_short_chunks_share_one_padded_call(window, q_heads, kv_heads):
    """Short prefill chunks of different lengths (one a whole prompt, others after cached context, one
    of two tokens) go through one padded SDPA call; a long one and decodes keep their own paths."""
    case = make_case([5, 1, 30, 2, 300, 1, 17], [5, 40, 61, 200, 300, 90, 256], q_heads=q_heads,
                     kv_heads=kv_heads, head_dim=16, sliding_window=window, pad_rows=2, seed=11)  # fmt: skip
    plan = cpu_attention.plan_step(case.cu_seqlens_q, case.seq_lens, case.block_tables, 16, window)
    assert plan.short is not None and plan.short.rows.shape == (4, 30)  # the 4 short chunks, padded to 30
    assert [ctx for *_, ctx in plan.chunks] == [300]
    assert int(plan.short.valid.sum()) == 5 + 30 + 2 + 17
    _check(case)
