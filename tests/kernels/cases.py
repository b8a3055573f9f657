"""Random paged-attention problems for the kernel tests and the GPU benchmark.

A case is one step: B sequences with new-query lengths ``q_lens`` and context lengths ``seq_lens`` (after the
KV write), their blocks scattered through a shuffled cache, plus ``pad_rows`` graph-padding query rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from batchgen.kernels import fp8_format


@dataclass
class PagedCase:
    query: torch.Tensor  # [T, Hq, D]
    key: torch.Tensor  # [T, Hkv, D] this step's new keys (already in the cache)
    value: torch.Tensor
    k_cache: torch.Tensor  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor
    cu_seqlens_q: torch.Tensor  # [B + 1] int32
    seq_lens: torch.Tensor  # [B] int32
    block_tables: torch.Tensor  # [B, max_blocks] int32
    slot_mapping: torch.Tensor  # [T] int64, -1 on padding rows
    scale: float
    sliding_window: int | None
    num_valid_rows: int

    @property
    def max_seq_len(self) -> int:
        return int(self.seq_lens.max()) if self.seq_lens.numel() else 0

    @property
    def max_q_len(self) -> int:
        return int((self.cu_seqlens_q[1:] - self.cu_seqlens_q[:-1]).max()) if self.seq_lens.numel() else 0

    def attn_args(self) -> tuple:
        return (self.query, self.k_cache, self.v_cache, self.cu_seqlens_q, self.seq_lens, self.block_tables,
                self.scale, self.sliding_window)  # fmt: skip


def _block_tables(seq_lens: list[int], block_size: int, num_blocks: int, gen, device) -> torch.Tensor:
    """Each sequence gets distinct blocks in shuffled order; unused entries point at the last block."""
    need = [-(-n // block_size) for n in seq_lens]
    perm = torch.randperm(num_blocks, generator=gen)
    table = torch.full((len(seq_lens), max(need + [1])), num_blocks - 1, dtype=torch.int32)
    used = 0
    for b, n in enumerate(need):
        table[b, :n] = perm[used : used + n].to(torch.int32)
        used += n
    return table.to(device)


def make_case(
    q_lens: list[int],
    seq_lens: list[int],
    *,
    q_heads: int,
    kv_heads: int,
    head_dim: int,
    block_size: int = 16,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    pad_rows: int = 0,
    sliding_window: int | None = None,
    spare_blocks: int = 3,
    seed: int = 0,
) -> PagedCase:
    assert len(q_lens) == len(seq_lens) and all(q <= s for q, s in zip(q_lens, seq_lens, strict=True))
    gen = torch.Generator().manual_seed(seed)
    num_blocks = sum(-(-n // block_size) for n in seq_lens) + spare_blocks
    cache_shape = (num_blocks, block_size, kv_heads, head_dim)
    # Every slot is random, used or not: a kernel that reads a wrong slot shows up as an error.
    k_cache = torch.randn(cache_shape, generator=gen).to(dtype)
    v_cache = torch.randn(cache_shape, generator=gen).to(dtype)
    num_rows = sum(q_lens) + pad_rows
    query = torch.randn((num_rows, q_heads, head_dim), generator=gen).to(dtype)
    tables = _block_tables(seq_lens, block_size, num_blocks, gen, "cpu")
    slots = torch.full((num_rows,), -1, dtype=torch.int64)
    row = 0
    for b, (q_len, n) in enumerate(zip(q_lens, seq_lens, strict=True)):
        pos = torch.arange(n - q_len, n)
        slots[row : row + q_len] = tables[b, pos // block_size].long() * block_size + pos % block_size
        row += q_len
    flat_k = k_cache.view(-1, kv_heads, head_dim)
    key = torch.randn((num_rows, kv_heads, head_dim), generator=gen).to(dtype)
    value = torch.randn((num_rows, kv_heads, head_dim), generator=gen).to(dtype)
    valid = slots >= 0
    flat_k[slots[valid]] = key[valid]
    v_cache.view(-1, kv_heads, head_dim)[slots[valid]] = value[valid]
    cu = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(q_lens, dtype=torch.int32), 0)
    to = lambda t: t.to(device)
    return PagedCase(
        to(query), to(key), to(value), to(k_cache), to(v_cache), to(cu),
        to(torch.tensor(seq_lens, dtype=torch.int32)), to(tables), to(slots),
        head_dim**-0.5, sliding_window, sum(q_lens),
    )  # fmt: skip


def rel_error(out: torch.Tensor, ref: torch.Tensor, rows: int) -> float:
    """||out - ref|| / ||ref|| over the first ``rows`` (non-padding) rows, in fp32."""
    out, ref = out[:rows].float(), ref[:rows].float()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-12))


def to_fp8_cache(case: PagedCase, kv_scales: tuple[float, float]) -> PagedCase:
    """``case`` with its caches as an FP8 cache stores them: ``k / k_scale`` and ``v / v_scale`` in e4m3."""
    case.k_cache = fp8_format.to_cache(case.k_cache, kv_scales[0]).to(fp8_format.FP8)
    case.v_cache = fp8_format.to_cache(case.v_cache, kv_scales[1]).to(fp8_format.FP8)
    return case


def llama_fp8_case(decode: bool, kv_scales: tuple[float, float]) -> PagedCase:
    """Llama-3-8B heads over an FP8 cache on CUDA, contexts to 2K: decodes, or chunks of up to 512 rows."""
    lens = [1000, 37, 2049, 512, 1, 700]
    q_lens = [1] * 6 if decode else [300, 37, 1, 512, 1, 129]
    case = make_case(q_lens, lens, q_heads=32, kv_heads=8, head_dim=128, dtype=torch.bfloat16, pad_rows=3,
                     device="cuda")  # fmt: skip
    return to_fp8_cache(case, kv_scales)


def same_fp8(a: fp8_format.Fp8Act, b: fp8_format.Fp8Act) -> None:
    """Two quantized activations are the same bits: e4m3 data and scales."""
    assert a.data.dtype == b.data.dtype == fp8_format.FP8 and a.scale.shape == b.scale.shape
    torch.testing.assert_close(a.scale, b.scale, rtol=0, atol=0)
    assert torch.equal(a.data.view(torch.uint8), b.data.view(torch.uint8))
