"""No attention kernel reads a block table past the step's widest table: the CUDA runner leaves those
columns as stale bytes (``cuda_slots.fill_host``). Poisoned columns (block ids far outside the cache: a
read would fault on the CPU or change the output) must give the clean tables' output, for the Triton
kernels (decode and prefill, under the interpreter off-GPU, bounded as a captured graph bounds them), the
torch reference and the CPU path, bf16 and FP8 caches."""

from __future__ import annotations

import pytest
import torch

from batchgen.kernels import fp8_format as ref
from batchgen.kernels import reference
from batchgen.kernels.attention.dispatch import paged_attention_triton
from batchgen.kernels.cpu.cpu_attention import paged_attention as cpu_attention
from tests.kernels.cases import make_case

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
POISON = 1 << 30  # a block id far past any cache


def _poisoned(case, width: int) -> torch.Tensor:
    """The tables as the runner hands them over: each row's blocks, zeros up to the step's widest table
    (the persistent table's padding, ``engine/rows.py``), then ``width`` - W columns of stale bytes,
    poisoned here with block ids far outside the cache."""
    block_size = case.k_cache.shape[1]
    step_width = -(-case.max_seq_len // block_size)
    device = case.block_tables.device
    tables = torch.full((len(case.seq_lens), width), POISON, dtype=torch.int32, device=device)
    tables[:, :step_width] = 0
    for b, n in enumerate(case.seq_lens.tolist()):
        used = -(-n // block_size)
        tables[b, :used] = case.block_tables[b, :used]
    return tables


CASES = {  # (q_lens, seq_lens): decode only (ragged contexts), and mixed prefill chunks with decodes
    "decode": ([1, 1, 1, 1], [5, 70, 16, 33]),
    "prefill": ([7, 1, 20, 3], [7, 40, 52, 19]),
}


WIDTH = 12  # table columns: room for 192 tokens of context at make_case's 16-token blocks


def _triton(case, kind: str):
    """The Triton dispatch as a captured graph calls it: bounded by the longest context it allows."""
    bound = WIDTH * case.k_cache.shape[1]
    return lambda *args, **kw: paged_attention_triton(
        *args, decode_only=kind == "decode", max_seq_len=bound, max_q_len=case.max_q_len, **kw
    )


@pytest.mark.parametrize("kind", list(CASES))
def test_columns_past_a_sequence_are_never_read(kind):
    q_lens, seq_lens = CASES[kind]
    case = make_case(q_lens, seq_lens, q_heads=8, kv_heads=2, head_dim=32, device=DEVICE, pad_rows=2)
    clean = case.attn_args()
    dirty = (*clean[:5], _poisoned(case, WIDTH), *clean[6:])
    want = reference.paged_attention(*clean)
    rows = case.num_valid_rows
    for run in (reference.paged_attention, _triton(case, kind)):
        torch.testing.assert_close(run(*dirty)[:rows], run(*clean)[:rows], rtol=0, atol=0)
    if DEVICE == "cpu":
        torch.testing.assert_close(cpu_attention(*dirty)[:rows], cpu_attention(*clean)[:rows], rtol=0, atol=0)
    torch.testing.assert_close(_triton(case, kind)(*dirty)[:rows], want[:rows], rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("kind", list(CASES))
def test_fp8_cache_columns_past_a_sequence_are_never_read(kind):
    q_lens, seq_lens = CASES[kind]
    case = make_case(q_lens, seq_lens, q_heads=8, kv_heads=2, head_dim=32, device=DEVICE)
    case.k_cache, case.v_cache = (ref.to_cache(c, 1.0).to(ref.FP8) for c in (case.k_cache, case.v_cache))
    clean = case.attn_args()
    dirty = (*clean[:5], _poisoned(case, WIDTH), *clean[6:])
    rows, scales, triton = case.num_valid_rows, (1.0, 1.0), _triton(case, kind)
    got = reference.paged_attention_fp8(*dirty, kv_scales=scales)[:rows]
    torch.testing.assert_close(
        got, reference.paged_attention_fp8(*clean, kv_scales=scales)[:rows], rtol=0, atol=0
    )
    got = triton(*dirty, kv_scales=scales)[:rows]
    torch.testing.assert_close(got, triton(*clean, kv_scales=scales)[:rows], rtol=0, atol=0)
