"""The Triton side of ``split_sums``: split-K partial products added in split order, by a summing kernel
(``sum_splits``) or inside the op that consumes them (``load_product``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from batchgen.kernels.launch.pdl import pdl_options, wait_for_producer


@triton.jit
def split_sum(p_ptr, offs, mask, stride_split, SPLITS: tl.constexpr):
    """The fp32 sum, in split order, of SPLITS partial products at ``offs`` (slices ``stride_split``
    apart): ``_sum_splits_kernel``'s arithmetic, for the ops that take a ``SplitSums`` as input."""
    acc = tl.zeros(offs.shape, dtype=tl.float32)
    for s in tl.static_range(SPLITS):
        acc += tl.load(p_ptr + s * stride_split + offs, mask=mask, other=0.0)
    return acc


@triton.jit
def load_product(ptr, offs, mask, stride_split, SPLITS: tl.constexpr, dt: tl.constexpr):
    """A product's values at ``offs`` in ``dt``: loaded, or with SPLITS > 1 its partials added in split
    order (``split_sum``) and rounded once, as the summing kernel stores them."""
    if SPLITS > 1:
        x = split_sum(ptr, offs, mask, stride_split, SPLITS)
    else:
        x = tl.load(ptr + offs, mask=mask, other=0.0)
    return x.to(dt)


@triton.jit
def _sum_splits_kernel(
    p_ptr, c_ptr, numel, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False
):
    """c = the sum of the SPLIT_K partial products [SPLIT_K, M, N], in split order (deterministic)."""
    wait_for_producer(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < numel
    tl.store(c_ptr + offs, split_sum(p_ptr, offs, ok, numel, SPLIT_K).to(c_ptr.dtype.element_ty), mask=ok)


def sum_splits(partials: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[S, M, N] fp32 partial products -> [M, N] in ``dtype``, added in split order."""
    splits, m, n = partials.shape
    out = torch.empty((m, n), dtype=dtype, device=partials.device)
    block = 1024
    if m:
        _sum_splits_kernel[(triton.cdiv(m * n, block),)](
            partials, out, m * n, SPLIT_K=splits, BLOCK=block, **pdl_options(partials[0])
        )
    return out
