"""V pages with tokens contiguous ([blocks, Hkv, D, block_size] in memory, behind the usual
[blocks, block_size, Hkv, D] view: ``kv_cache.allocate(v_pages=True)``): the kernels write and read them as
they do K-like pages, against the torch reference over the same values in K's layout.

Reading V page by page loads whole pages, so a sequence's last page is read past its end: those slots are
given large finite values here (a real cache holds zeros or an older sequence's values), which must weigh 0.
"""

from __future__ import annotations

import pytest
import torch

from batchgen.engine import kv_cache
from batchgen.kernels import fp8_reference as ref
from batchgen.kernels import reference
from batchgen.kernels.attn_tile import v_pages_hold_tokens
from batchgen.kernels.cases import llama_fp8_case, make_case, rel_error
from batchgen.kernels.decode import decode_attention
from batchgen.kernels.kv_write import write_kv
from batchgen.kernels.prefill import prefill_attention
from batchgen.kernels.rope import rope_write_kv

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def as_v_pages(v_cache: torch.Tensor) -> torch.Tensor:
    """The same values, tokens contiguous in each page's head-dim lanes."""
    blocks, size, heads, dim = v_cache.shape
    pages = torch.empty((blocks, heads, dim, size), dtype=v_cache.dtype, device=v_cache.device)
    pages = pages.permute(0, 3, 1, 2)
    pages.copy_(v_cache)
    return pages


def _poison_tails(case, value: float) -> None:
    """Slots past each sequence's end in its last page: finite garbage in V (K's are masked anyway)."""
    size = case.v_cache.shape[1]
    for table, length in zip(case.block_tables.tolist(), case.seq_lens.tolist(), strict=True):
        if length % size:
            case.v_cache[table[(length - 1) // size], length % size :] = value


def _case(q_lens, seq_lens, fp8: bool, block_size: int = 16, window: int | None = None, seed: int = 0):
    case = make_case(q_lens, seq_lens, q_heads=6, kv_heads=2, head_dim=16, block_size=block_size,
                     sliding_window=window, pad_rows=2, device=DEVICE, seed=seed)  # fmt: skip
    if fp8:
        case.k_cache, case.v_cache = case.k_cache.to(ref.FP8), case.v_cache.to(ref.FP8)
    _poison_tails(case, 400.0)  # e4m3's range ends at 448
    return case


def _with_pages(case) -> tuple:
    args = list(case.attn_args())
    args[2] = as_v_pages(case.v_cache)
    assert v_pages_hold_tokens(args[1], args[2])
    return tuple(args)


def _want(case, fp8: bool) -> torch.Tensor:
    if fp8:
        return ref.paged_attention(*case.attn_args(), (1.0, 1.0))
    return reference.paged_attention(*case.attn_args())


@pytest.mark.parametrize("fp8", [True, False])
@pytest.mark.parametrize(("num_splits", "block_n", "block_size"), [(1, 32, 16), (3, 16, 16), (2, 32, 32)])
def test_decode_reads_v_pages(fp8, num_splits, block_n, block_size):
    case = _case([1] * 4, [1, 17, 40, 75], fp8, block_size, seed=num_splits)
    got = decode_attention(*_with_pages(case), max_seq_len=75, num_splits=num_splits, block_n=block_n)
    rows = decode_attention(*case.attn_args(), max_seq_len=75, num_splits=num_splits, block_n=block_n)
    assert rel_error(got, _want(case, fp8), case.num_valid_rows) < 1e-3
    torch.testing.assert_close(got[: case.num_valid_rows], rows[: case.num_valid_rows], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fp8", [True, False])
@pytest.mark.parametrize(("num_splits", "block_n"), [(2, 16), (3, 32)])
def test_decode_with_a_window_starts_on_a_page(fp8, num_splits, block_n):
    """The window's first key is mid-page: the page is read from its start, the keys before masked."""
    case = _case([1] * 3, [10, 50, 97], fp8, window=21)
    got = decode_attention(*_with_pages(case), max_seq_len=97, num_splits=num_splits, block_n=block_n)
    assert rel_error(got, _want(case, fp8), case.num_valid_rows) < 1e-3


@pytest.mark.parametrize("fp8", [True, False])
@pytest.mark.parametrize("window", [None, 11])
@pytest.mark.parametrize("block_n", [16, 32])  # one page a tile, two
def test_prefill_reads_v_pages(fp8, window, block_n):
    case = _case([5, 1, 12, 3], [5, 21, 19, 70], fp8, window=window, seed=7)
    got = prefill_attention(*_with_pages(case), block_m=16, block_n=block_n)
    assert rel_error(got, _want(case, fp8), case.num_valid_rows) < 1e-3


def test_kv_write_fills_v_pages():
    case = make_case([3, 1, 5], [3, 18, 40], q_heads=6, kv_heads=3, head_dim=16, pad_rows=2, device=DEVICE)
    k_want, v_want = torch.randn_like(case.k_cache), torch.randn_like(case.v_cache)
    k_got, v_got = k_want.clone(), as_v_pages(v_want)
    reference.write_kv(k_want, v_want, case.key, case.value, case.slot_mapping)
    write_kv(k_got, v_got, case.key, case.value, case.slot_mapping)
    assert torch.equal(k_got, k_want) and torch.equal(v_got.contiguous(), v_want)


def test_rope_writes_fp8_v_pages():
    torch.manual_seed(7)
    tokens, q_heads, kv_heads, dim = 6, 4, 2, 32
    qkv = torch.randn(tokens, (q_heads + 2 * kv_heads) * dim, device=DEVICE) * 30
    freqs = torch.arange(16.0)[:, None] * (1.0 / 10000 ** (torch.arange(0, dim, 2) / dim))[None, :]
    cos, sin = freqs.cos().to(DEVICE), freqs.sin().to(DEVICE)
    positions = torch.tensor([0, 3, 4, 9, 15, 2], device=DEVICE)
    slots = torch.tensor([5, 0, 11, 3, 7, -1], device=DEVICE)
    want = [torch.zeros(4, 4, kv_heads, dim, dtype=ref.FP8, device=DEVICE) for _ in range(2)]
    got = [want[0].clone(), as_v_pages(want[1])]
    args = (positions, cos, sin, None, None, 1e-6)
    reference.rope_write_kv(qkv.clone(), *args, *want, slots, q_heads, kv_heads, (0.1, 2.0))
    rope_write_kv(qkv, *args, *got, slots, q_heads, kv_heads, (0.1, 2.0))
    for mine, exp in zip(got, want, strict=True):
        assert torch.equal(mine.contiguous().view(torch.uint8), exp.view(torch.uint8))


def test_allocated_v_pages_are_what_the_kernels_read():
    shape = kv_cache.KVShape(num_layers=2, num_kv_heads=3, head_dim=16)
    for v_pages in (False, True):
        (k, v), _ = kv_cache.allocate(shape, 5, 8, ref.FP8, torch.device("cpu"), v_pages)
        assert k.shape == v.shape == (5, 8, 3, 16) and v_pages_hold_tokens(k, v) is v_pages
        assert not v.float().any()


def test_v_pages_only_for_an_fp8_cache_read_by_triton_and_only_when_asked(monkeypatch):
    """Off until measured on the H200 (docs/kernels.md): ``BATCHGEN_FP8_V_PAGES=1`` asks for them."""
    from batchgen.config import EngineConfig
    from batchgen.engine.build import _fp8_v_pages

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    monkeypatch.delenv("BATCHGEN_FP8_V_PAGES", raising=False)
    assert not _fp8_v_pages(EngineConfig(), cuda, ref.FP8)
    monkeypatch.setenv("BATCHGEN_FP8_V_PAGES", "1")
    assert _fp8_v_pages(EngineConfig(), cuda, ref.FP8)
    assert not _fp8_v_pages(EngineConfig(block_size=64), cuda, ref.FP8)  # tiles of 32 hold no whole page
    assert not _fp8_v_pages(EngineConfig(), cuda, torch.bfloat16)
    assert not _fp8_v_pages(EngineConfig(), cpu, ref.FP8)
    assert not _fp8_v_pages(EngineConfig(attention_backend="torch"), cuda, ref.FP8)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("decode", [True, False])
def test_gpu_fp8_v_pages_at_llama_shapes(decode):
    """Llama-3-8B heads, contexts to 2K, through the dispatcher's default tiles: V pages give what V rows
    give (the same values, another path through shared memory), and both what the reference gives."""
    from batchgen.kernels.dispatch import paged_attention_triton

    kv_scales = (0.25, 0.5)
    case = llama_fp8_case(decode, kv_scales)
    _poison_tails(case, 400.0)
    bounds = dict(decode_only=decode, max_seq_len=4096, max_q_len=512, kv_scales=kv_scales)
    pages = paged_attention_triton(*_with_pages(case), **bounds)
    rows = paged_attention_triton(*case.attn_args(), **bounds)
    n = case.num_valid_rows
    assert rel_error(pages, ref.paged_attention(*case.attn_args(), kv_scales), n) < 2e-2
    assert rel_error(pages, rows, n) < 1e-3
