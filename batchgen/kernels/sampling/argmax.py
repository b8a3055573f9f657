"""Greedy picks: the row-wise argmax of logits [S, V], with torch.argmax's answer (the first maximum; NaN
counts as the largest value, the first NaN wins).

On CUDA two Triton passes over column blocks: torch's reduction gives each row one block of threads,
32 blocks for a decode step of 32 rows over a 128K vocabulary, far too few to read its 8 MB of logits at
the GPU's bandwidth. Here (row, block) programs each find their block's first maximum, then
one program per row picks the first best block.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK = 4096  # columns per first-pass program: 32 programs per row of Llama-3's 128K vocabulary


@triton.jit
def first_max_combine(v1, i1, v2, i2):
    """(value, index) pairs: the larger value wins, NaN above all, ties to the lower index."""
    n1 = v1 != v1
    n2 = v2 != v2
    same = (v1 == v2) | (n1 & n2)
    first = (n1 & ~n2) | ((n1 == n2) & ((v1 > v2) | (same & (i1 < i2))))
    return tl.where(first, v1, v2), tl.where(first, i1, i2)


@triton.jit
def _block_argmax_kernel(
    x_ptr,  # [S, V] logits
    val_ptr,  # [S, n_blocks] fp32: each block's maximum
    idx_ptr,  # [S, n_blocks] int32: its first column
    stride_x,
    n_cols,
    n_blocks,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    blk = tl.program_id(1)
    cols = blk * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride_x + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
    best, at = tl.reduce((x, cols), 0, first_max_combine)
    tl.store(val_ptr + row * n_blocks + blk, best)
    tl.store(idx_ptr + row * n_blocks + blk, at)


@triton.jit
def _row_argmax_kernel(val_ptr, idx_ptr, out_ptr, n_blocks, n_cols, BLOCKS_PAD: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    b = tl.arange(0, BLOCKS_PAD)
    ok = b < n_blocks
    vals = tl.load(val_ptr + row * n_blocks + b, mask=ok, other=float("-inf"))
    idxs = tl.load(idx_ptr + row * n_blocks + b, mask=ok, other=n_cols)  # past every real column
    _, at = tl.reduce((vals, idxs), 0, first_max_combine)
    tl.store(out_ptr + row, at.to(tl.int64))


def row_argmax(logits: torch.Tensor, block: int = _BLOCK) -> torch.Tensor:
    """logits [S, V] (unit column stride) -> int64 [S]; ``block``: columns per first-pass program."""
    rows, cols = logits.shape
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if rows == 0:
        return out
    assert logits.stride(-1) == 1
    n_blocks = triton.cdiv(cols, block)
    vals = torch.empty((rows, n_blocks), dtype=torch.float32, device=logits.device)
    idxs = torch.empty((rows, n_blocks), dtype=torch.int32, device=logits.device)
    _block_argmax_kernel[(rows, n_blocks)](logits, vals, idxs, logits.stride(0), cols, n_blocks, BLOCK=block)
    pad = max(2, triton.next_power_of_2(n_blocks))
    _row_argmax_kernel[(rows,)](vals, idxs, out, n_blocks, cols, BLOCKS_PAD=pad)
    return out
