"""Paged attention for the CPU path: each sequence costs its own context, never the batch's longest.

Same contract and cache layout as ``reference.paged_attention`` (the oracle it is tested against).

Decodes (one query row each) run together, split by KV block in the manner of flash-decoding: every
(sequence, block) pair is one item of a batched matmul, and the pairs' partial softmaxes are merged per
sequence. The work is the sum of the sequences' own block counts, with a fixed number of torch ops per
layer whatever the batch holds. The reference instead pads every decode to the longest context: in B4
(78 prompts, two of them long) each step gathered many times the K and V of the sequences' own
contexts, and attention took most of the run (docs/results.md, "Figures behind code choices").

Multi-token query runs (prefill chunks) with a long context go one sequence at a time through SDPA over
that sequence's own blocks: each large enough to amortise the call, and SDPA's CPU kernel never
materialises the [Lq, Lk] score matrix of a long prompt. Short ones (context <= ``SHORT_CONTEXT``) are
padded into one SDPA call per step and layer (``ChunkBatch``): one call per short prompt paid each call's
overhead dozens of times a layer.

Only the blocks a query can see are read: with a sliding window, those inside the window.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F


class DecodePlan(NamedTuple):
    """Which cache blocks each decode reads: one entry per (sequence, block) pair, P pairs in all."""

    seq: torch.Tensor  # [P] int64, the pair's sequence (0..B-1), pairs of one sequence adjacent
    rank: torch.Tensor  # [P] int64, the pair's index among its sequence's pairs
    blocks: torch.Tensor  # [P] int64, the cache block
    bias: torch.Tensor  # [P, block_size] float32: 0 where the query sees the slot, -inf elsewhere
    max_pairs: int  # the most pairs any one sequence has


def plan_decode(
    seq_lens: torch.Tensor,  # [B] context lengths after this step's write
    block_tables: torch.Tensor,  # [B, max_blocks]
    block_size: int,
    sliding_window: int | None,
) -> DecodePlan:
    device = seq_lens.device
    last = seq_lens.long() - 1  # [B] the query's position
    first = torch.zeros_like(last)  # [B] first visible position
    if sliding_window is not None:
        first = (last - sliding_window + 1).clamp(min=0)
    first_block = first // block_size
    counts = last // block_size - first_block + 1  # [B] blocks per sequence, each >= 1
    seq = torch.repeat_interleave(torch.arange(len(counts), device=device), counts)  # [P]
    rank = torch.arange(len(seq), device=device) - (counts.cumsum(0) - counts)[seq]
    column = first_block[seq] + rank  # [P] the block's index in its sequence's table
    blocks = block_tables.long()[seq, column]
    pos = column.view(-1, 1) * block_size + torch.arange(block_size, device=device)  # [P, bs]
    visible = (pos <= last[seq].view(-1, 1)) & (pos >= first[seq].view(-1, 1))
    bias = torch.zeros(pos.shape, device=device).masked_fill_(~visible, float("-inf"))
    return DecodePlan(seq, rank, blocks, bias, int(counts.max()))


def compute_dtype(cache: torch.Tensor) -> torch.dtype:
    """What the attention products run in: a 16-bit cache's own dtype (a CPU with avx512_bf16 or AMX
    multiplies bf16 several times faster than fp32, and no converted copy of the gathered blocks is made),
    with fp32 accumulation, softmax and merge, as torch's SDPA does; fp32 for fp32 and FP8 caches."""
    return cache.dtype if cache.dtype in (torch.bfloat16, torch.float16) else torch.float32


def decode_attention(
    query: torch.Tensor,  # [B, Hq, D], one row per sequence (rows may be strided)
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor,
    plan: DecodePlan,
    scale: float,
) -> torch.Tensor:  # [B, Hq, D] float32
    batch, q_heads, dim = query.shape
    kv_heads = k_cache.shape[2]
    pairs = len(plan.seq)
    dtype = compute_dtype(k_cache)
    # Gathering from the [blocks, Hkv, bs, D] view writes each block head-major in one pass, so the
    # matmuls below read it without another copy.
    k = k_cache.transpose(1, 2).index_select(0, plan.blocks).to(dtype)  # [P, Hkv, bs, D]
    v = v_cache.transpose(1, 2).index_select(0, plan.blocks).to(dtype)
    q = query.view(batch, kv_heads, -1, dim).to(dtype).index_select(0, plan.seq)  # [P, Hkv, G, D]
    scores = torch.matmul(q, k.transpose(-1, -2)).float().mul_(scale)  # [P, Hkv, G, bs]
    scores.add_(plan.bias.view(pairs, 1, 1, -1))
    peak = scores.amax(-1, keepdim=True)  # [P, Hkv, G, 1], finite: every pair sees >= 1 slot
    probs = torch.exp(scores.sub_(peak))
    partial = torch.matmul(probs.to(dtype), v).float().view(pairs, q_heads, dim)  # [P, Hq, D] unnormalised
    return _merge(peak.view(pairs, q_heads), probs.sum(-1).view(pairs, q_heads), partial, plan, batch)


def _merge(
    peak: torch.Tensor,  # [P, Hq] each pair's score maximum
    total: torch.Tensor,  # [P, Hq] each pair's sum of exp(score - peak)
    partial: torch.Tensor,  # [P, Hq, D] each pair's exp-weighted sum of values
    plan: DecodePlan,
    batch: int,
) -> torch.Tensor:  # [B, Hq, D]
    """Combine the pairs of each sequence: rescale to the sequence's maximum score, sum, normalise."""
    heads = peak.shape[1]
    grid = peak.new_full((batch, plan.max_pairs, heads), float("-inf"))  # small: B x pairs x heads
    grid[plan.seq, plan.rank] = peak
    weight = torch.exp(peak - grid.amax(1).index_select(0, plan.seq))  # [P, Hq]
    norm = peak.new_zeros(batch, heads).index_add_(0, plan.seq, total * weight)
    out = partial.new_zeros(batch, heads, partial.shape[2])
    out.index_add_(0, plan.seq, partial * weight.unsqueeze(-1))
    return out / norm.unsqueeze(-1)


def chunk_attention(
    query: torch.Tensor,  # [Lq, Hq, D], the sequence's new tokens, the last Lq of its context
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    table: torch.Tensor,  # [max_blocks], the sequence's block table
    ctx: int,  # context length after this step's write
    scale: float,
    sliding_window: int | None,
) -> torch.Tensor:  # [Lq, Hq, D] in compute_dtype
    block_size, kv_heads, dim = k_cache.shape[1:]
    q_len = query.shape[0]
    start = 0 if sliding_window is None else max(0, ctx - q_len - sliding_window + 1)
    first, n_blocks = start // block_size, -(-ctx // block_size)
    blocks = table[first:n_blocks].long()
    offset = first * block_size  # position of the first gathered slot
    k = k_cache.index_select(0, blocks).view(-1, kv_heads, dim)[: ctx - offset]  # [Lk, Hkv, D]
    v = v_cache.index_select(0, blocks).view(-1, kv_heads, dim)[: ctx - offset]
    k_pos = torch.arange(offset, ctx, device=query.device)
    q_pos = torch.arange(ctx - q_len, ctx, device=query.device)
    mask = k_pos.view(1, -1) <= q_pos.view(-1, 1)  # [Lq, Lk] causal, aligned to the context's end
    if sliding_window is not None:
        mask &= k_pos.view(1, -1) > q_pos.view(-1, 1) - sliding_window
    # 4-d inputs: with 3-d ones and GQA, torch takes SDPA's math path, slower on a long prompt
    # and materialising the [Hq, Lq, Lk] scores the flash path avoids.
    dtype = compute_dtype(k_cache)
    out = F.scaled_dot_product_attention(
        query.transpose(0, 1).to(dtype).unsqueeze(0),  # [1, Hq, Lq, D]
        k.transpose(0, 1).to(dtype).unsqueeze(0),  # [1, Hkv, Lk, D]
        v.transpose(0, 1).to(dtype).unsqueeze(0),
        attn_mask=mask,
        scale=scale,
        enable_gqa=True,
    )
    return out[0].transpose(0, 1)


SHORT_CONTEXT = 256  # prefill chunks up to this context share one padded SDPA call


class ChunkBatch(NamedTuple):
    """Short prefill chunks padded to one [n, Lq, Lk] problem: Lq the longest chunk, Lk its blocks."""

    rows: torch.Tensor  # [n, Lq] int64, each query's row in the step (padding: row 0, output dropped)
    valid: torch.Tensor  # [n, Lq] bool, real queries
    blocks: torch.Tensor  # [n, nb] int64, each sequence's first nb cache blocks (padding: its block 0)
    mask: torch.Tensor  # [n, 1, Lq, nb * block_size] bool, slots each query sees (a padding query: slot 0)


def plan_chunk_batch(
    chunks: list[tuple[int, int, torch.Tensor, int]], block_size: int, sliding_window: int | None
) -> ChunkBatch:
    device = chunks[0][2].device  # the block tables' (the torch backend also runs on CUDA)
    q_max = max(end - start for start, end, _, _ in chunks)
    n_blocks = max(-(-ctx // block_size) for *_, ctx in chunks)
    offsets = torch.arange(q_max, device=device)
    starts = torch.tensor([start for start, *_ in chunks], device=device).view(-1, 1)
    q_lens = torch.tensor([end - start for start, end, _, _ in chunks], device=device).view(-1, 1)
    ctxs = torch.tensor([ctx for *_, ctx in chunks], device=device).view(-1, 1)
    valid = offsets < q_lens  # [n, Lq]
    rows = torch.where(valid, starts + offsets, 0)
    blocks = torch.stack([table[:n_blocks].long() for _, _, table, _ in chunks])
    in_context = torch.arange(n_blocks, device=device) * block_size < ctxs
    blocks = torch.where(in_context, blocks, blocks[:, :1])
    q_pos = (ctxs - q_lens + offsets).unsqueeze(-1)  # [n, Lq, 1]
    k_pos = torch.arange(n_blocks * block_size, device=device).view(1, 1, -1)  # [1, 1, Lk]
    mask = k_pos <= q_pos  # causal: below the context's end too, since q_pos < ctx
    if sliding_window is not None:
        mask &= k_pos > q_pos - sliding_window
    mask[:, :, 0] |= ~valid  # a padding query sees one slot: no all-masked row (NaN) in SDPA
    return ChunkBatch(rows, valid, blocks, mask.unsqueeze(1))


def batched_chunk_attention(
    query: torch.Tensor,  # [T, Hq, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor,
    batch: ChunkBatch,
    scale: float,
) -> torch.Tensor:  # [R, Hq, D] in compute_dtype: the real queries, in row order
    n, q_max = batch.rows.shape
    _, _, kv_heads, dim = k_cache.shape
    dtype = compute_dtype(k_cache)
    q = query.index_select(0, batch.rows.view(-1)).view(n, q_max, -1, dim).transpose(1, 2)  # [n, Hq, Lq, D]
    k = k_cache.index_select(0, batch.blocks.view(-1)).view(n, -1, kv_heads, dim).transpose(1, 2)
    v = v_cache.index_select(0, batch.blocks.view(-1)).view(n, -1, kv_heads, dim).transpose(1, 2)
    out = F.scaled_dot_product_attention(
        q.to(dtype), k.to(dtype), v.to(dtype), attn_mask=batch.mask, scale=scale, enable_gqa=True
    )  # [n, Hq, Lq, D]
    return out.transpose(1, 2)[batch.valid]


class StepPlan(NamedTuple):
    """What a step's attention reads; the same in every layer (of one sliding window), so made once."""

    decode_rows: torch.Tensor | None  # [Bd] the query rows of one-token sequences
    decode: DecodePlan | None
    chunks: list[tuple[int, int, torch.Tensor, int]]  # multi-token runs: (first row, end row, table, context)
    decodes_only: bool = False  # row b is sequence b's one query: the decodes' output is the whole output
    short: ChunkBatch | None = None  # the short chunks, in one call (then not in ``chunks``)


def plan_step(
    cu_seqlens_q: torch.Tensor,  # [B + 1] int32
    seq_lens: torch.Tensor,  # [B] int32, context length after this step's write
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    block_size: int,
    sliding_window: int | None,
) -> StepPlan:
    cu, lens = cu_seqlens_q.tolist(), seq_lens.tolist()
    q_lens = [cu[b + 1] - cu[b] for b in range(len(cu) - 1)]
    chunks = [(cu[b], cu[b + 1], block_tables[b], lens[b]) for b, n in enumerate(q_lens) if n > 1]
    short = [chunk for chunk in chunks if chunk[3] <= SHORT_CONTEXT]
    batch = None
    if len(short) > 1:
        batch = plan_chunk_batch(short, block_size, sliding_window)
        chunks = [chunk for chunk in chunks if chunk[3] > SHORT_CONTEXT]
    decodes = [b for b, n in enumerate(q_lens) if n == 1]
    if not decodes:
        return StepPlan(None, None, chunks, short=batch)
    picked = torch.tensor(decodes, device=seq_lens.device)
    plan = plan_decode(
        seq_lens.index_select(0, picked), block_tables.index_select(0, picked), block_size, sliding_window
    )
    rows = cu_seqlens_q[:-1].long().index_select(0, picked)
    only = batch is None and not chunks and cu[-1] == len(decodes)
    return StepPlan(rows, plan, chunks, decodes_only=only, short=batch)


def attend(
    query: torch.Tensor,  # [T, q_heads, head_dim]
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    plan: StepPlan,
    scale: float,
    sliding_window: int | None,
) -> torch.Tensor:  # [T, q_heads, head_dim]
    if plan.decodes_only and query.shape[0] == len(plan.decode_rows):  # a decode step: no scatter
        return decode_attention(query, k_cache, v_cache, plan.decode, scale).to(query.dtype)
    out = query.new_zeros(query.shape)  # graph-padding rows past cu_seqlens_q[-1] stay zero
    if plan.decode is not None:
        decoded = decode_attention(
            query.index_select(0, plan.decode_rows), k_cache, v_cache, plan.decode, scale
        )
        out[plan.decode_rows] = decoded.to(out.dtype)
    if plan.short is not None:
        batched = batched_chunk_attention(query, k_cache, v_cache, plan.short, scale)
        out[plan.short.rows[plan.short.valid]] = batched.to(out.dtype)
    for start, end, table, ctx in plan.chunks:
        chunk = chunk_attention(query[start:end], k_cache, v_cache, table, ctx, scale, sliding_window)
        out[start:end] = chunk.to(out.dtype)
    return out


def paged_attention(
    query: torch.Tensor,  # [T, q_heads, head_dim]
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,  # [B + 1] int32
    seq_lens: torch.Tensor,  # [B] int32, context length after this step's write
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:  # [T, q_heads, head_dim]
    plan = plan_step(cu_seqlens_q, seq_lens, block_tables, k_cache.shape[1], sliding_window)
    return attend(query, k_cache, v_cache, plan, scale, sliding_window)
