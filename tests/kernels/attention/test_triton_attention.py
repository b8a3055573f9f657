"""Triton KV write / decode / varlen-prefill kernels against the torch reference (the oracle).

Off-GPU these run under TRITON_INTERPRET=1 (see conftest.py) at tiny shapes; the interpreter runs each
program in numpy, so shapes stay small while still covering several tiles, splits and pages.
"""

from __future__ import annotations

import pytest
import torch

from batchgen.kernels import reference
from batchgen.kernels.attention import dispatch
from batchgen.kernels.attention.decode import choose_num_splits, decode_attention
from batchgen.kernels.attention.dispatch import paged_attention_triton, write_kv
from batchgen.kernels.attention.prefill import prefill_attention
from tests.kernels.cases import make_case, rel_error

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-3, torch.bfloat16: 2e-2, torch.float16: 5e-3}


def _check(out: torch.Tensor, case, tol: float) -> None:
    ref = reference.paged_attention(*case.attn_args())
    assert out.shape == ref.shape and out.dtype == ref.dtype
    err = rel_error(out, ref, case.num_valid_rows)
    assert err < tol, f"relative error {err:.2e} >= {tol:.0e}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_write_kv_matches_reference(dtype):
    case = make_case([3, 1, 5], [3, 18, 40], q_heads=6, kv_heads=3, head_dim=16, pad_rows=2, dtype=dtype,
                     device=DEVICE)  # fmt: skip
    k_ref, v_ref = torch.randn_like(case.k_cache), torch.randn_like(case.v_cache)
    k_out, v_out = k_ref.clone(), v_ref.clone()
    reference.write_kv(k_ref, v_ref, case.key, case.value, case.slot_mapping)
    write_kv(k_out, v_out, case.key, case.value, case.slot_mapping)
    assert torch.equal(k_out, k_ref) and torch.equal(v_out, v_ref)


def test_write_kv_strided_input_and_cast():
    """A strided view (as sliced from a fused qkv projection) is read in place; fp32 rows cast to bf16."""
    case = make_case([4], [9], q_heads=2, kv_heads=2, head_dim=32, device=DEVICE)
    fused = torch.randn(4, 3, 2, 32, device=DEVICE)  # [T, (q|k|v), H, D]
    k_ref = case.k_cache.to(torch.bfloat16)
    v_ref = case.v_cache.to(torch.bfloat16)
    k_out, v_out = k_ref.clone(), v_ref.clone()
    reference.write_kv(k_ref, v_ref, fused[:, 1], fused[:, 2], case.slot_mapping)
    write_kv(k_out, v_out, fused[:, 1], fused[:, 2], case.slot_mapping)
    # One bf16 ulp: the interpreter truncates fp32 -> bf16 where the GPU and torch round to nearest.
    torch.testing.assert_close(k_out, k_ref, rtol=2**-7, atol=0)
    torch.testing.assert_close(v_out, v_ref, rtol=2**-7, atol=0)


# (q_heads, kv_heads): GQA ratios 1, 3 (SmolLM2's 9/3), 4 and 8.
GQA = [(4, 4), (9, 3), (8, 2), (8, 1)]


@pytest.mark.parametrize(("q_heads", "kv_heads"), GQA)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_ragged_gqa(q_heads, kv_heads, num_splits):
    # Ragged contexts with partial last blocks, a 1-token context and 2 graph-padding rows.
    case = make_case([1] * 4, [1, 17, 40, 75], q_heads=q_heads, kv_heads=kv_heads, head_dim=16,
                     pad_rows=2, device=DEVICE, seed=q_heads + num_splits)  # fmt: skip
    out = decode_attention(*case.attn_args(), max_seq_len=75, num_splits=num_splits, block_n=16)
    _check(out, case, TOL[torch.float32])


@pytest.mark.parametrize(("head_dim", "block_size"), [(32, 32), (64, 16), (128, 32)])
def test_decode_head_dims_and_block_sizes(head_dim, block_size):
    case = make_case([1, 1, 1], [33, 64, 90], q_heads=4, kv_heads=2, head_dim=head_dim,
                     block_size=block_size, device=DEVICE, seed=head_dim)  # fmt: skip
    out = decode_attention(*case.attn_args(), max_seq_len=90, num_splits=2, block_n=32)
    _check(out, case, TOL[torch.float32])


def test_decode_sliding_window_and_underestimated_bound():
    # max_seq_len below the real length: the last split picks up the rest, slower but still right.
    case = make_case([1] * 3, [10, 50, 97], q_heads=8, kv_heads=2, head_dim=16, sliding_window=24,
                     device=DEVICE)  # fmt: skip
    out = decode_attention(*case.attn_args(), max_seq_len=40, num_splits=4, block_n=16)
    _check(out, case, TOL[torch.float32])


def test_decode_padding_sequence_is_not_written():
    """A graph-padding sequence (no query row, context 0) writes nothing and breaks nothing."""
    case = make_case([1, 1, 0], [30, 7, 0], q_heads=4, kv_heads=1, head_dim=16, pad_rows=1, device=DEVICE)
    out = torch.full_like(case.query, 7.0)
    decode_attention(*case.attn_args(), max_seq_len=32, num_splits=2, block_n=16, out=out)
    _check(out, case, TOL[torch.float32])
    assert torch.all(out[2:] == 7.0)


@pytest.mark.parametrize(("q_heads", "kv_heads"), GQA)
def test_prefill_chunked_ragged_gqa(q_heads, kv_heads):
    # Fresh prompts (context == q_len), later chunks over cached tokens, a decode row (q_len 1), padding.
    case = make_case([5, 1, 12, 3], [5, 21, 19, 33], q_heads=q_heads, kv_heads=kv_heads, head_dim=16,
                     pad_rows=3, device=DEVICE, seed=q_heads)  # fmt: skip
    out = prefill_attention(*case.attn_args(), block_m=16, block_n=16)
    _check(out, case, TOL[torch.float32])


@pytest.mark.parametrize(("head_dim", "block_size", "block_m"), [(32, 32, 32), (64, 16, 64), (128, 16, 16)])
def test_prefill_head_dims_and_tiles(head_dim, block_size, block_m):
    case = make_case([20, 7], [52, 7], q_heads=4, kv_heads=2, head_dim=head_dim, block_size=block_size,
                     device=DEVICE, seed=head_dim)  # fmt: skip
    out = prefill_attention(*case.attn_args(), block_m=block_m, block_n=16)
    _check(out, case, TOL[torch.float32])


def test_prefill_sliding_window_and_empty_sequence():
    case = make_case([9, 0, 17], [40, 0, 17], q_heads=9, kv_heads=3, head_dim=16, sliding_window=11,
                     pad_rows=2, device=DEVICE)  # fmt: skip
    out = prefill_attention(*case.attn_args(), block_m=16, block_n=16)
    _check(out, case, TOL[torch.float32])


@pytest.mark.parametrize("decode_only", [True, False])
def test_dispatcher_bf16(decode_only):
    q_lens = [1, 1, 1] if decode_only else [6, 1, 3]
    case = make_case(q_lens, [20, 45, 9], q_heads=8, kv_heads=2, head_dim=32, dtype=torch.bfloat16,
                     pad_rows=1, device=DEVICE)  # fmt: skip
    out = paged_attention_triton(*case.attn_args(), decode_only=decode_only, max_seq_len=64, max_q_len=6)
    _check(out, case, TOL[torch.bfloat16])


@pytest.mark.parametrize(("window", "max_seq_len"), [(None, 64), (7, 64), (None, 2048)])  # 2048: 2 splits
def test_dispatcher_decode_rows_ahead_of_prompts(window, max_seq_len, monkeypatch):
    """A step with prompts whose first sequences decode: those rows run the decode kernel, the chunks the
    varlen kernel on cu_seqlens from their first row; padding rows stay as ``out`` held them."""
    rows = {}  # kernel -> query rows it was given

    def recording(name: str):
        kernel = getattr(dispatch, name)

        def run(query, *args, **kwargs):
            rows[name] = len(query)
            return kernel(query, *args, **kwargs)

        return run

    for name in ("decode_attention", "prefill_attention"):
        monkeypatch.setattr(dispatch, name, recording(name))
    q_lens = [1, 1, 1, 6, 1, 3]  # 3 leading decodes; a chunk of 1 later is still the varlen kernel's
    case = make_case(q_lens, [20, 45, 9, 30, 12, 3], q_heads=8, kv_heads=2, head_dim=32, dtype=torch.bfloat16,
                     pad_rows=2, sliding_window=window, device=DEVICE)  # fmt: skip
    cu = case.cu_seqlens_q
    out = torch.full_like(case.query, 7.0)
    got = paged_attention_triton(
        *case.attn_args(), decode_only=False, max_seq_len=max_seq_len, max_q_len=6, out=out, decode_rows=3,
        prompt_cu_seqlens_q=cu[3:] - 3,
    )  # fmt: skip
    assert got.data_ptr() == out.data_ptr()
    _check(got, case, TOL[torch.bfloat16])
    assert bool((got[case.num_valid_rows :] == 7.0).all())
    assert rows == {"decode_attention": 3, "prefill_attention": len(case.query) - 3}


def test_num_splits_fill_the_gpu_and_stay_bounded():
    assert choose_num_splits(32, 8, 8192, 132) * 32 * 8 >= 2 * 132
    assert choose_num_splits(256, 8, 1024, 132) == 1
    assert choose_num_splits(1, 8, 300, 132) == 2  # capped: splits below MIN_SPLIT_TOKENS don't pay


# ---- GPU only: moderate shapes, graph capture ----------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(("q_heads", "kv_heads", "head_dim"), [(32, 8, 128), (9, 3, 64), (16, 16, 64)])
def test_gpu_moderate_shapes(dtype, q_heads, kv_heads, head_dim):
    lens = [1000, 37, 2049, 512, 1, 700]
    decode = make_case([1] * 6, lens, q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim, dtype=dtype,
                       pad_rows=3, device="cuda")  # fmt: skip
    out = paged_attention_triton(*decode.attn_args(), decode_only=True, max_seq_len=4096, max_q_len=1)
    _check(out, decode, TOL[dtype])
    q_lens = [300, 37, 1, 512, 1, 129]
    prefill = make_case(q_lens, lens, q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim, dtype=dtype,
                        block_size=32, pad_rows=5, sliding_window=None, device="cuda")  # fmt: skip
    out = paged_attention_triton(*prefill.attn_args(), decode_only=False, max_seq_len=4096, max_q_len=512)
    _check(out, prefill, TOL[dtype])
    mixed = make_case([1] * 5 + [300, 129], lens + [1200], q_heads=q_heads, kv_heads=kv_heads,
                      head_dim=head_dim, dtype=dtype, pad_rows=5, device="cuda")  # fmt: skip
    cu = mixed.cu_seqlens_q
    out = paged_attention_triton(*mixed.attn_args(), decode_only=False, max_seq_len=4096, max_q_len=300,
                                 decode_rows=5, prompt_cu_seqlens_q=cu[5:] - 5)  # fmt: skip
    _check(out, mixed, TOL[dtype])


@pytest.mark.gpu
@pytest.mark.parametrize("decode_only", [True, False])
def test_gpu_cuda_graph_capture_and_replay(decode_only):
    """Capture write + attention once; replay after changing the inputs in place: results track them."""
    q_lens = [1] * 4 if decode_only else [64, 1, 17, 5]
    case = make_case(q_lens, [100, 300, 40, 600], q_heads=32, kv_heads=8, head_dim=128, dtype=torch.bfloat16,
                     pad_rows=2, device="cuda")  # fmt: skip
    kw = dict(decode_only=decode_only, max_seq_len=1024, max_q_len=64)
    static_out = torch.zeros_like(case.query)
    run = lambda: paged_attention_triton(*case.attn_args(), out=static_out, **kw)
    write = lambda: write_kv(case.k_cache, case.v_cache, case.key, case.value, case.slot_mapping)
    write()  # compile outside the capture
    run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        write()
        run()
    case.query.normal_()
    case.seq_lens.sub_(torch.tensor([0, 50, 0, 100], dtype=torch.int32, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    _check(static_out, case, TOL[torch.bfloat16])
