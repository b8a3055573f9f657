"""Run a fused forward over one token sequence through a paged KV cache, outside the engine: all
positions' logits, the sequence fed in chunks (a chunked prefill, then decodes). Tests compare forwards
with it, and ``scripts/fp8_quality.py`` scores a fixed text teacher-forced with it (so an FP8 cache is
written and read as the engine does)."""

from __future__ import annotations

import torch

from batchgen.model.backends import KernelBackend, PagedContext, TorchBackend
from batchgen.model.kv_cache import KVShape


def paged_caches(shape: KVShape, tokens: int, block_size: int, dtype: torch.dtype, device) -> list:
    dims = (-(-tokens // block_size), block_size, shape.num_kv_heads, shape.head_dim)
    return [
        (torch.zeros(dims, dtype=dtype, device=device), torch.zeros(dims, dtype=dtype, device=device))
        for _ in range(shape.num_layers)
    ]


def context(start: int, length: int, caches, backend: KernelBackend) -> PagedContext:
    """One sequence whose tokens [start, start + length) are this step's; its blocks in reversed order."""
    device = caches[0][0].device
    block = caches[0][0].shape[1]
    total = start + length
    table = torch.arange(caches[0][0].shape[0] - 1, -1, -1, dtype=torch.int32, device=device)  # scattered
    pos = torch.arange(start, total, device=device)
    slots = table[pos // block].long() * block + pos % block
    return PagedContext(
        caches, slots, torch.tensor([0, length], dtype=torch.int32, device=device),
        torch.tensor([total], dtype=torch.int32, device=device), table.unsqueeze(0), length, total, backend,
    )  # fmt: skip


def sequence_logits(
    forward, ids: torch.Tensor, chunks: list[int], shape: KVShape, cache_dtype: torch.dtype,
    backend: KernelBackend | None = None, block_size: int = 4,
) -> torch.Tensor:  # fmt: skip
    """Logits [sum(chunks), V] of ``ids`` [sum(chunks)] fed in ``chunks`` through a fresh paged cache."""
    caches = paged_caches(shape, sum(chunks), block_size, cache_dtype, ids.device)
    out, start = [], 0
    for length in chunks:
        ctx = context(start, length, caches, backend or TorchBackend())
        positions = torch.arange(start, start + length, device=ids.device)
        kept = torch.arange(length, device=ids.device)
        out.append(forward(ids[start : start + length], positions, kept, ctx))
        start += length
    return torch.cat(out)
