"""fp32 projections on the CPU through oneDNN.

torch's ``F.linear`` on an fp32 CPU tensor calls MKL's sgemm. oneDNN's inner product
(``torch.ops.mkldnn._linear_pointwise``, what torch's inductor emits for CPU linears) is faster at every
row count a CPU batch has, most with the weight packed once into oneDNN's blocked layout, both with one
weight in cache and with every weight read from memory in turn, as a forward reads them
(``docs/results.md``). So every fp32 projection goes through
oneDNN.

``PackedLinear`` holds the packed copy instead of the plain weight (no extra memory); the LM head, whose
weight is often the embedding table as well, multiplies the plain weight (``linear``). The products are
exact fp32 either way; only the summation order differs.

oneDNN compiles one primitive per row count it sees (code and descriptors held in memory) and keeps up
to 1024 of them. A batch's row count takes every value from 1 to the token budget, so a long job's RSS
grew by about a gigabyte and, once the cache was full, recompiled on most calls, each call then costing
many times its product (docs/results.md). So every call is cut into pieces whose
row counts come from a fixed set of 35 (``row_pieces``): the primitives are compiled in the first steps
and memory stays flat after.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _available() -> bool:
    ops = torch.ops.mkldnn
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(ops, "_linear_pointwise")
        and hasattr(ops, "_reorder_linear_weight")
    )


ONEDNN = _available()


# Row counts a oneDNN call may have: 1-16 as they are, 24-56 in steps of 8 (a batch of 17-63 rows is
# padded: at that size the weight's read dominates), and 64 x (1, 2, 3, 4, 6, 8, ..., 128) for larger
# batches, taken largest first; the rest is one piece of 8-64 rows that overlaps the one before it.
EXACT_ROWS = 16
ROW_STEP = 8
BIG_PIECES = tuple(64 * m for m in (128, 96, 64, 48, 32, 24, 16, 12, 8, 6, 4, 3, 2, 1))


def _round_up(rows: int, step: int) -> int:
    return -(-rows // step) * step


def row_pieces(rows: int) -> list[tuple[int, int]]:
    """(start, length) of the calls that cover rows [0, rows), lengths from the fixed set above. A piece
    may start before the previous one ends (the overlap is computed twice and kept once) and the only
    piece of a small batch may run past its end (zero rows padded)."""
    if rows <= EXACT_ROWS:
        return [(0, rows)]
    if rows < BIG_PIECES[-1]:
        return [(0, _round_up(rows, ROW_STEP))]
    pieces, start = [], 0
    for size in BIG_PIECES:
        while rows - start >= size:
            pieces.append((start, size))
            start += size
    if start < rows:
        last = _round_up(rows - start, ROW_STEP)
        pieces.append((rows - last, last))
    return pieces


ROW_COUNTS = (
    frozenset(range(1, EXACT_ROWS + 1))
    | frozenset(range(ROW_STEP, BIG_PIECES[-1], ROW_STEP))
    | frozenset(BIG_PIECES)
)


def _in_pieces(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``_linear_pointwise`` over x [T, in] -> [T, out], one call per piece of ``row_pieces(T)``."""
    rows, outs, done = x.shape[0], [], 0
    if rows in ROW_COUNTS:  # most decode steps: one call as it is
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    for start, length in row_pieces(rows):
        part = x[start : start + length]
        if length > rows:  # a small batch padded to the next row count of the set
            part = F.pad(part, (0, 0, 0, length - rows))
        out = torch.ops.mkldnn._linear_pointwise(part, weight, bias, "none", [], "")
        outs.append(out[done - start : rows - start])  # [rows this piece adds, out]
        done = start + length
    return outs[0] if len(outs) == 1 else torch.cat(outs)


def packable(weight: torch.Tensor) -> bool:
    return ONEDNN and weight.is_cpu and weight.dtype == torch.float32 and weight.dim() == 2


class PackedLinear:
    """An fp32 projection on the CPU with its weight in oneDNN's layout ([T, in] -> [T, out])."""

    act_quant = None

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.out_features, self.in_features = weight.shape  # weight: [out, in]
        self.weight = torch.ops.mkldnn._reorder_linear_weight(weight, None)  # opaque, packed
        self.bias = bias

    def __call__(self, x: torch.Tensor, summed: bool = True) -> torch.Tensor:  # always summed
        flat = x.reshape(-1, self.in_features)
        if flat.shape[0] == 0:
            return x.new_empty((*x.shape[:-1], self.out_features))
        return _in_pieces(flat, self.weight, self.bias).view(*x.shape[:-1], self.out_features)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear`` with a plain weight; fp32 on the CPU through oneDNN."""
    if ONEDNN and x.is_cpu and x.dtype == torch.float32 and x.dim() == 2 and x.shape[0] > 0:
        return _in_pieces(x, weight, bias)
    return F.linear(x, weight, bias)
