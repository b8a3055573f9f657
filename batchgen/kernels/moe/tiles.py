"""Tile shapes of the mixture-of-experts grouped GEMMs (``routed_experts.py``): by the mean rows per expert,
the weights' element size and their scale blocks, and each kernel's own where the down GEMM has them."""

from __future__ import annotations

import torch

from batchgen.kernels.moe.expert_format import Fp8Experts

Weights = torch.Tensor | Fp8Experts  # [E, N, K]
# Prompt-sized groups: row tiles of activations swept across every column tile in groups of this many
# (grouping.program_tiles), so each is read from memory once, not once per column tile.
PREFILL_GROUP_M = 4


def config_for(
    pairs: int, experts: int, itemsize: int, weight_itemsize: int, k_blocks: tuple[int, int] | None = None
) -> dict:
    """Tile shapes by the mean rows per expert: decode-sized groups are weight-bandwidth bound (small
    BLOCK_M, long K tiles), prefill-sized ones compute bound (tensor-core-sized tiles). The shapes are
    chosen by ``scripts/moe_split.py``'s sweep (docs/results.md) for 2-byte data, and for e4m3 weights
    (``weight_itemsize`` 1) at decode and prefill sizes, where the down projection takes its own tiles
    (the ``"down"`` key: ``kernel_tiles``). fp32 halves BLOCK_K so the staged tiles still fit shared
    memory (a Hopper SM has 227 KiB). Block-scaled e4m3 weights (``k_blocks``: columns per block, the
    columns of the first block before the first) need each K tile inside one block column."""
    per_expert = -(-pairs // experts)
    if per_expert <= 32 and weight_itemsize == 1:  # e4m3: each GEMM the sweep's best tiles
        cfg = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=3)
        cfg["down"] = dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=4)
    elif per_expert <= 32:  # one row tile holds most groups: each expert's weights are read once
        cfg = dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=3)
    elif per_expert <= 128:
        cfg = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=3)
    elif weight_itemsize == 1:  # e4m3: each GEMM the sweep's best tiles
        cfg = dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=3, GROUP_M=PREFILL_GROUP_M)
        cfg["down"] = dict(
            BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=4, GROUP_M=PREFILL_GROUP_M
        )
    else:  # wide N tiles: each A tile gathered from the hidden states feeds twice the columns
        cfg = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=4, GROUP_M=PREFILL_GROUP_M)
    for tiles in [cfg, *([cfg["down"]] if "down" in cfg else [])]:
        if itemsize > 2:
            tiles["BLOCK_K"] //= 2
        if k_blocks is not None:
            tiles["BLOCK_K"] = _block_k(tiles["BLOCK_K"], *k_blocks)
    return cfg


def _block_k(block_k: int, cols: int, col0: int) -> int:
    """The largest K tile up to ``block_k`` that never straddles a scale block's column edge."""
    k = min(block_k, cols, col0 & -col0 if col0 else cols)  # col0 & -col0: its lowest set bit
    assert cols % k == 0 and col0 % k == 0 and k >= 16 and k & (k - 1) == 0, f"{cols}-column blocks"
    return k


def kernel_tiles(cfg: dict, kernel: str) -> dict:
    """One kernel's tiles from a layer's config: ``"down"`` overrides the shared tiles for the down GEMM."""
    shared = {k: v for k, v in cfg.items() if k != "down"}
    return {**shared, **cfg.get("down", {})} if kernel == "down" else shared


def weight_of(w: Weights) -> torch.Tensor:
    return w.weight if isinstance(w, Fp8Experts) else w


def _k_blocks(*stacks: Weights) -> tuple[int, int] | None:
    """(columns per block, the first block's columns before the first) that the K tiles must respect."""
    blocked = [w for w in stacks if isinstance(w, Fp8Experts) and w.block is not None]
    if not blocked:
        return None
    cols = min(w.block[1] for w in blocked)
    col0 = 0
    for w in blocked:
        col0 |= w.offset[1]  # a tile that divides every offset divides their bitwise or's lowest bit
    return cols, col0


def tile_config(h: torch.Tensor, ids: torch.Tensor, gate_up: Weights, down: Weights) -> dict:
    """The tiles ``moe_experts`` picks for these pairs and weights."""
    experts, weight_itemsize = weight_of(gate_up).shape[0], weight_of(gate_up).element_size()
    return config_for(ids.numel(), experts, h.element_size(), weight_itemsize, _k_blocks(gate_up, down))
