"""A split-K product handed on before its partial sums are added: the op that consumes it adds them.

At decode sizes the FP8 product splits K over programs (``fp8_gemm.choose_split_k``), each writing an
fp32 partial product; a second kernel used to add them before anything read the result. Where the next
op reads the product row by row anyway (the residual add + RMSNorm after o_proj and down_proj, rotary
after q|k|v), it adds the partials itself, in split order with the same fp32 arithmetic and one rounding
to the model dtype, so its input is bit for bit the summed product and one launch a projection is gone.
Any other consumer calls ``summed``. Torch only: the Triton side is ``split_sums_triton``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class SplitSums(NamedTuple):
    partials: torch.Tensor  # [S, M, N] fp32, one slice per K split
    dtype: torch.dtype  # the product's dtype once summed

    @property
    def shape(self) -> torch.Size:  # [M, N]
        return self.partials.shape[1:]


def summed(x: torch.Tensor | SplitSums) -> torch.Tensor:
    """The product itself: a tensor as it is; partials added (in split order) and rounded to its dtype."""
    if not isinstance(x, SplitSums):
        return x
    from batchgen.kernels.gemm.split_sums_triton import sum_splits

    return sum_splits(x.partials, x.dtype)
