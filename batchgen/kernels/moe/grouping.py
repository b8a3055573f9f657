"""Grouping a step's (token, slot) pairs by routed expert, on the device, for the grouped GEMMs of
``routed_experts.py``: ``group_by_expert`` counts each expert's pairs and sorts them (a counting sort:
``_count_kernel`` then ``_place_kernel``); ``tile_rows`` gives a GEMM program its expert and rows from the
per-expert counts alone, ``program_tiles`` its row and column tiles. Nothing is read back to the host
(capturable in a CUDA graph)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _count_kernel(ids_ptr, counts_ptr, P, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < P
    e = tl.load(ids_ptr + offs, mask=mask, other=0)
    tl.atomic_add(counts_ptr + e, 1, mask=mask)


@triton.jit
def _place_kernel(ids_ptr, counts_ptr, cursor_ptr, order_ptr, P, E, BLOCK: tl.constexpr, E_PAD: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < P
    experts = tl.arange(0, E_PAD)
    counts = tl.load(counts_ptr + experts, mask=experts < E, other=0)
    starts = tl.cumsum(counts, 0) - counts  # [E_PAD] exclusive prefix: each expert's first sorted position
    e = tl.load(ids_ptr + offs, mask=mask, other=0)
    start = tl.sum(tl.where(experts[None, :] == e[:, None], starts[None, :], 0), axis=1)  # starts[e]
    rank = tl.atomic_add(cursor_ptr + e, 1, mask=mask)
    tl.store(order_ptr + start + rank, offs.to(tl.int32), mask=mask)


@triton.jit
def program_tiles(row_tiles, n_tiles, GROUP_M: tl.constexpr):
    """(row tile, column tile) of this program in a 1-D grid of ``row_tiles * n_tiles``. GROUP_M 0: the row
    tiles vary fastest (programs running together share a column tile of the weights: decode, where each
    expert has about one row tile); else groups of GROUP_M row tiles are swept across every column tile
    before the next group (programs running together share their row tiles of activations, which a
    prompt-sized step would otherwise read again from memory for every column tile)."""
    pid = tl.program_id(0)
    if GROUP_M == 0:
        return pid % row_tiles, pid // row_tiles
    in_group = GROUP_M * n_tiles
    first = (pid // in_group) * GROUP_M
    size = tl.minimum(row_tiles - first, GROUP_M)
    return first + (pid % in_group) % size, (pid % in_group) // size


@triton.jit
def tile_rows(counts_ptr, E, tile, BLOCK_M: tl.constexpr, E_PAD: tl.constexpr):
    """Row tile ``tile``'s expert, its rows [BLOCK_M] in sorted order and their mask; expert -1 when the
    tile lies past the last real one."""
    experts = tl.arange(0, E_PAD)
    counts = tl.load(counts_ptr + experts, mask=experts < E, other=0)
    tiles = (counts + BLOCK_M - 1) // BLOCK_M
    tile_end = tl.cumsum(tiles, 0)
    e = tl.sum((tile_end <= tile).to(tl.int32), axis=0)  # the first expert whose tiles reach past `tile`
    mine = experts == e
    first_tile = tl.sum(tl.where(mine, tile_end - tiles, 0), axis=0)
    count = tl.sum(tl.where(mine, counts, 0), axis=0)
    start = tl.sum(tl.where(mine, tl.cumsum(counts, 0) - counts, 0), axis=0)
    local = (tile - first_tile) * BLOCK_M + tl.arange(0, BLOCK_M)
    return tl.where(e < E, e, -1), start + local, local < count


def group_by_expert(ids: torch.Tensor, experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(counts [E] int32, order [P] int32): the T * K pairs (``ids`` [T, K]) sorted by expert."""
    flat = ids.reshape(-1)
    pairs = flat.numel()
    counters = torch.zeros(2 * experts, dtype=torch.int32, device=ids.device)  # counts | cursors
    order = torch.empty(pairs, dtype=torch.int32, device=ids.device)
    if pairs:
        _count_kernel[(triton.cdiv(pairs, 256),)](flat, counters, pairs, BLOCK=256, num_warps=4)
        block = 64  # x E_PAD one-hot lanes to look up each pair's group start
        _place_kernel[(triton.cdiv(pairs, block),)](
            flat, counters, counters[experts:], order, pairs, experts,
            BLOCK=block, E_PAD=triton.next_power_of_2(experts), num_warps=4,
        )  # fmt: skip
    return counters[:experts], order
