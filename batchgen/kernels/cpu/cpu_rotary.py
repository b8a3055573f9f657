"""Rotary embedding + KV write for the CPU path, bit-identical to ``reference.rope_write_kv``.

The reference rotates q and k separately, expands cos / sin per layer (gather, repeat) and writes the
cache through a boolean selection: ~20 torch ops a layer. Here the step's cos / sin rows and written
slots are looked up once per step (``plan_rotary``: every layer has the same positions and slots), q
and k, adjacent in the fused projection, rotate together in six ops, and k / v go to the cache with one
``index_copy_`` each: a fraction of the reference's time a layer in B4's decode steps.

Bit-identity: the reference computes ``x * cos + cat(-x2, x1) * sin``; here the halves are
``x1 * c - x2 * s`` and ``x2 * c + x1 * s``, and ``a + (-b) * s == a - b * s`` exactly in IEEE
arithmetic (each op rounds once, in the same order).
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class RotaryPlan(NamedTuple):
    """What every layer of one step shares: the rows' frequencies and the cache slots they write."""

    cos: torch.Tensor  # [T, 1, D / 2], model dtype
    sin: torch.Tensor
    slots: torch.Tensor  # [W] int64, the cache slots of the rows written
    rows: torch.Tensor | None  # [W] the rows written; None when every row is (no padding rows)


def plan_rotary(
    positions: torch.Tensor,  # [T] int64
    cos: torch.Tensor,  # [max_positions, D / 2]
    sin: torch.Tensor,
    slot_mapping: torch.Tensor,  # [T] int64, -1 = padding row, not written
) -> RotaryPlan:
    valid = slot_mapping >= 0
    rows = None if bool(valid.all()) else valid.nonzero().squeeze(1)
    slots = slot_mapping if rows is None else slot_mapping.index_select(0, rows)
    return RotaryPlan(cos[positions].unsqueeze(1), sin[positions].unsqueeze(1), slots.long(), rows)


def rope_write_kv(
    qkv: torch.Tensor,  # [T, (Hq + 2 * Hkv) * D], the fused projection's output
    plan: RotaryPlan,
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D], 16/32-bit
    v_cache: torch.Tensor,
    q_heads: int,
    kv_heads: int,
) -> torch.Tensor:  # [T, Hq, D], the rotated queries (a view: rows strided by (Hq + Hkv) * D)
    tokens, half = qkv.shape[0], plan.cos.shape[-1]
    dim, heads = 2 * half, q_heads + kv_heads
    qk = qkv[:, : heads * dim].view(tokens, heads, 2, half)  # [T, Hq + Hkv, 2, D / 2]
    x1, x2 = qk[:, :, 0], qk[:, :, 1]
    out = qkv.new_empty(tokens, heads, 2, half)
    first, second = out[:, :, 0], out[:, :, 1]
    torch.mul(x1, plan.cos, out=first).sub_(x2 * plan.sin)
    torch.mul(x2, plan.cos, out=second).add_(x1 * plan.sin)
    rotated = out.view(tokens, heads, dim)
    key = rotated[:, q_heads:]  # [T, Hkv, D]
    value = qkv[:, heads * dim :].view(tokens, kv_heads, dim)
    _write(k_cache, key, plan)
    _write(v_cache, value, plan)
    return rotated[:, :q_heads]


def _write(cache: torch.Tensor, rows: torch.Tensor, plan: RotaryPlan) -> None:
    flat = cache.view(-1, *cache.shape[2:])  # [num_blocks * block_size, Hkv, D]
    if plan.rows is not None:
        rows = rows.index_select(0, plan.rows)
    flat.index_copy_(0, plan.slots, rows.to(flat.dtype))
