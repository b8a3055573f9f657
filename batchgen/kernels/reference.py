"""Torch reference kernels: the oracle the Triton kernels are tested against, and the CPU path.

Paged attention (over a model-dtype or an FP8 cache) and KV write first, then the fused layer ops
(RMSNorm with residual add, q/k norm + rotary + KV write, SiLU-and-multiply) and the routed experts of a
MoE layer, written with transformers' own arithmetic and rounding.

Cache layout (one pair per layer): ``k_cache``, ``v_cache``: [num_blocks, block_size, num_kv_heads, head_dim].
Token slot ``s`` lives at block ``s // block_size``, offset ``s % block_size``.

A step packs B sequences' new tokens into T rows. Sequence b owns query rows
``cu_seqlens_q[b]:cu_seqlens_q[b+1]`` and, after the KV write, has ``seq_lens[b]`` tokens in the cache,
so its i-th new token sits at position ``seq_lens[b] - q_len_b + i`` and attends causally to cache
positions ``[0, pos]`` (within ``sliding_window`` tokens when given). Rows past ``cu_seqlens_q[-1]``
(graph padding) are ignored and their output is left as zeros.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from batchgen.kernels.fp8_format import to_cache


def write_kv(
    k_cache: torch.Tensor,  # [num_blocks, block_size, kv_heads, head_dim]
    v_cache: torch.Tensor,
    key: torch.Tensor,  # [T, kv_heads, head_dim]
    value: torch.Tensor,
    slot_mapping: torch.Tensor,  # [T] int64, -1 = padding row, not written
) -> None:
    num_blocks, block_size = k_cache.shape[:2]
    flat_k = k_cache.view(num_blocks * block_size, *k_cache.shape[2:])
    flat_v = v_cache.view(num_blocks * block_size, *v_cache.shape[2:])
    # Boolean selection syncs on CUDA (the torch backend never runs inside a graph); a sync-free scatter
    # of padding rows into some scratch slot would race with a real row writing that slot.
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    flat_k[slots] = key[valid].to(flat_k.dtype)
    flat_v[slots] = value[valid].to(flat_v.dtype)


def _gather_context(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    blocks = cache.index_select(0, block_table)  # [n_blocks, block_size, kv_heads, head_dim]
    return blocks.reshape(-1, *cache.shape[2:])[:length]  # [length, kv_heads, head_dim]


def _attend(q, k, v, q_pos, k_pos, scale, sliding_window):
    # q: [Hq, Lq, D]; k, v: [Hkv, Lk, D]; q_pos: [Lq]; k_pos: [Lk]
    mask = k_pos.view(1, -1) <= q_pos.view(-1, 1)
    if sliding_window is not None:
        mask &= k_pos.view(1, -1) > q_pos.view(-1, 1) - sliding_window
    kv_heads, lq, dim = k.shape[0], q.shape[1], q.shape[2]
    q = q.reshape(kv_heads, -1, dim)  # [Hkv, G*Lq, D]: a GQA group's heads share one K/V
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale  # [Hkv, G*Lq, Lk]
    scores = scores.view(kv_heads, -1, lq, k.shape[1]).masked_fill(~mask, float("-inf"))
    out = torch.matmul(F.softmax(scores, dim=-1).view(kv_heads, -1, k.shape[1]), v.float())
    return out.view(-1, lq, dim)  # [Hq, Lq, D]


def _decode_attention(query, k_cache, v_cache, seq_lens, block_tables, scale, sliding_window):
    """All single-token sequences at once, padded to the longest context. query: [B, Hq, D]."""
    batch, q_heads, dim = query.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    n_blocks = -(-int(seq_lens.max()) // block_size)
    table = block_tables[:, :n_blocks].long()
    k = k_cache[table].reshape(batch, -1, kv_heads, dim).transpose(1, 2).float()  # [B, Hkv, L, D]
    v = v_cache[table].reshape(batch, -1, kv_heads, dim).transpose(1, 2).float()
    q = query.view(batch, kv_heads, -1, dim).float()  # [B, Hkv, G, D]
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale  # [B, Hkv, G, L]
    k_pos = torch.arange(k.shape[2], device=query.device).view(1, -1)
    last = (seq_lens.long() - 1).view(-1, 1)
    mask = k_pos <= last
    if sliding_window is not None:
        mask &= k_pos > last - sliding_window
    scores = scores.masked_fill(~mask.view(batch, 1, 1, -1), float("-inf"))
    return torch.matmul(F.softmax(scores, dim=-1), v).reshape(batch, q_heads, dim)


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
    out = torch.zeros_like(query)
    cu = cu_seqlens_q.tolist()
    q_lens = [cu[b + 1] - cu[b] for b in range(len(cu) - 1)]
    decodes = [b for b, n in enumerate(q_lens) if n == 1]
    if decodes:
        rows = torch.tensor([cu[b] for b in decodes], device=query.device)
        picked = torch.tensor(decodes, device=query.device)
        out[rows] = _decode_attention(
            query[rows], k_cache, v_cache, seq_lens[picked], block_tables[picked], scale, sliding_window
        ).to(out.dtype)
    block_size = k_cache.shape[1]
    for b, ctx in enumerate(seq_lens.tolist()):
        start, end = cu[b], cu[b + 1]
        if end - start <= 1:
            continue
        n_blocks = -(-ctx // block_size)
        table = block_tables[b, :n_blocks].long()
        k = _gather_context(k_cache, table, ctx).transpose(0, 1)  # [Hkv, ctx, D]
        v = _gather_context(v_cache, table, ctx).transpose(0, 1)
        q = query[start:end].transpose(0, 1)  # [Hq, Lq, D]
        k_pos = torch.arange(ctx, device=query.device)
        q_pos = k_pos[ctx - (end - start) :]
        out[start:end] = _attend(q, k, v, q_pos, k_pos, scale, sliding_window).transpose(0, 1).to(out.dtype)
    return out


def paged_attention_fp8(
    query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor, block_tables: torch.Tensor, scale: float, sliding_window: int | None,
    kv_scales: tuple[float, float],
) -> torch.Tensor:  # fmt: skip
    """``paged_attention`` over an FP8 cache: the blocks this step reads are dequantized to fp32
    (``q * scale``) into a compact cache, and the block tables renumbered to it."""
    block_size = k_cache.shape[1]
    n_blocks = -(-int(seq_lens.max()) // block_size) if seq_lens.numel() else 1
    table = block_tables[:, :n_blocks].long()
    used, local = torch.unique(table, return_inverse=True)
    k = k_cache[used].float() * kv_scales[0]
    v = v_cache[used].float() * kv_scales[1]
    out = paged_attention(
        query.float(), k, v, cu_seqlens_q, seq_lens, local.to(torch.int32), scale, sliding_window
    )
    return out.to(query.dtype)


# --- fused layer ops ---------------------------------------------------------------------------------


def rms_norm(
    x: torch.Tensor,  # [..., H]
    weight: torch.Tensor,  # [H]
    eps: float,
    residual: torch.Tensor | None = None,  # [..., H]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(x + residual), x + residual): the sum rounded to the model dtype, the norm in fp32,
    the weight product in the model dtype (transformers' order, so bf16 results match it)."""
    if residual is not None:
        x = residual + x
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype), x


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, halves convention: x * cos + rotate_half(x) * sin. x: [T, H, D]; cos: [T, 1, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos) + (rotated * sin)


def rope_write_kv(
    qkv: torch.Tensor,  # [T, (Hq + 2 * Hkv) * D], the fused projection's output
    positions: torch.Tensor,  # [T] int64
    cos: torch.Tensor,  # [max_positions, D / 2], model dtype
    sin: torch.Tensor,
    q_norm: torch.Tensor | None,  # [D] per-head RMSNorm weights (Qwen3) or None
    k_norm: torch.Tensor | None,
    eps: float,
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [T] int64, -1 = padding row, not written
    q_heads: int,
    kv_heads: int,
    kv_scales: tuple[float, float] = (1.0, 1.0),  # an FP8 cache stores k / k_scale, v / v_scale
) -> torch.Tensor:  # [T, Hq, D], the rotated queries
    """Split q/k/v, apply the optional per-head norm and rotary embedding, write k/v to the cache."""
    tokens, dim = qkv.shape[0], 2 * cos.shape[-1]
    q, k, v = qkv.split([q_heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    q, k, v = q.view(tokens, q_heads, dim), k.view(tokens, kv_heads, dim), v.view(tokens, kv_heads, dim)
    if q_norm is not None:
        q, k = rms_norm(q, q_norm, eps)[0], rms_norm(k, k_norm, eps)[0]
    c = cos[positions].repeat(1, 2).unsqueeze(1)  # [T, 1, D]: both halves share the frequencies
    s = sin[positions].repeat(1, 2).unsqueeze(1)
    q, k = _rotate(q, c, s), _rotate(k, c, s)
    if k_cache.dtype == torch.float8_e4m3fn:
        k, v = to_cache(k, kv_scales[0]), to_cache(v, kv_scales[1])
    write_kv(k_cache, v_cache, k, v, slot_mapping)
    return q


def silu_mul(x: torch.Tensor) -> torch.Tensor:  # x: [T, 2 * I] (gate | up) -> [T, I]
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


# --- mixture of experts ------------------------------------------------------------------------------


def grouped_mm(x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Rows of ``x`` [S, in] sorted by group times their group's ``weight`` [G, in, out] (a transposed
    view of [G, out, in]); ``offsets`` [G] int32 are the groups' cumulative ends. torch's grouped GEMM
    when it takes these operands (the op transformers' experts use), else one mm per group."""
    grouped = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)
    if grouped is not None:
        try:
            return grouped(x, weight, offs=offsets)
        except (RuntimeError, NotImplementedError):  # e.g. strides not 16-byte multiples, or a dtype
            pass
    out = x.new_zeros(x.shape[0], weight.shape[2])
    start = 0
    for group, end in enumerate(offsets.tolist()):
        if end > start:
            torch.mm(x[start:end], weight[group], out=out[start:end])
        start = end
    return out


Rewrite = Callable[[torch.Tensor], torch.Tensor]


def _same(t: torch.Tensor) -> torch.Tensor:
    return t


def moe_experts(
    h: torch.Tensor,  # [T, H]
    weights: torch.Tensor,  # [T, K] routing weights (model dtype, or fp32 for Mixtral)
    ids: torch.Tensor,  # [T, K] expert ids
    gate_up: torch.Tensor,  # [E, 2I, H]
    down: torch.Tensor,  # [E, H, I]
    # what the products' inputs become (FP8 activations): h for gate|up, the activations for down
    inputs: tuple[Rewrite, Rewrite] | None = None,
) -> torch.Tensor:  # [T, H]
    """The routed experts' weighted sum, step for step as transformers' grouped_mm experts compute it
    (so fp32 and bf16 results are bit-identical to its layer): pairs sorted by expert, one grouped GEMM
    for gate|up and one for down, the weight product in the promoted dtype, the K rows summed.
    ``inputs`` rewrites h and the down product's input before their products."""
    tokens, top_k = ids.shape
    flat = ids.reshape(-1)
    _, perm = torch.sort(flat)
    h_in, act_in = inputs or (_same, _same)
    x = h_in(h)[perm // top_k]  # [P, H] grouped by expert
    counts = torch.bincount(flat, minlength=gate_up.shape[0])
    offsets = torch.cumsum(counts, 0, dtype=torch.int32)
    act = silu_mul(grouped_mm(x, gate_up.transpose(-2, -1), offsets))  # [P, I]
    y = grouped_mm(act_in(act), down.transpose(-2, -1), offsets) * weights.reshape(-1)[perm].unsqueeze(-1)
    unsorted = torch.empty_like(y)
    unsorted[perm] = y
    return unsorted.view(tokens, top_k, -1).sum(dim=1).to(h.dtype)
