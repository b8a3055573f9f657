"""How a projection's weights are stored and multiplied: the weight formats.

A format turns checkpoint tensors (``Part``s of a ``WeightSource``) into a ``Linear``: a callable
``[T, in] -> [T, out]``. Several parts stack along the output rows (q|k|v, gate|up), each already cut
to the rank's shard. Embeddings, norms and the LM head are not projections: they stay dense.
Formats: dense (the model dtype, here), FP8 quantized at load (``fp8.py``), FP8 checkpoints
(``fp8_checkpoint.py``); ``choose_format.py`` picks a checkpoint's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from batchgen.kernels.cpu import cpu_linear
from batchgen.kernels.fp8_format import ActQuant, Fp8Act
from batchgen.kernels.gemm.split_sums import SplitSums
from batchgen.model.weights.sources import Part, WeightSource


class Linear(Protocol):
    out_features: int
    # How the input should arrive: None = in the model dtype; else quantized to FP8 as this says, which
    # the fused op producing the input can do as it writes it (an ``Fp8Act``).
    act_quant: ActQuant | None

    # [T, in] -> [T, out]; ``summed`` False: a split-K product may come back as its partials, for a
    # consumer that adds them (``kernels/gemm/split_sums.py``)
    def __call__(self, x: torch.Tensor | Fp8Act, summed: bool = True) -> torch.Tensor | SplitSums: ...


class DenseLinear:
    """A plain weight in the model dtype (``F.linear``, so bf16 rounds as transformers' layers do; fp32 on
    the CPU through oneDNN, packed (``cpu_linear.PackedLinear``) unless the weight is a model's own)."""

    act_quant = None

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight, self.bias = weight, bias  # [out, in], [out]
        self.out_features = weight.shape[0]

    def __call__(self, x: torch.Tensor, summed: bool = True) -> torch.Tensor:  # always summed
        return cpu_linear.linear(x, self.weight, self.bias)


class WeightFormat(Protocol):
    name: str

    def linear(self, source: WeightSource, parts: Sequence[Part], bias: bool) -> Linear: ...


def stacked_bias(source: WeightSource, parts: Sequence[Part], dtype: torch.dtype) -> torch.Tensor | None:
    """The parts' biases stacked like their weights (None when the projection has none)."""
    names = [p.name.removesuffix(".weight") + ".bias" for p in parts]
    if not source.has(names[0]):
        return None
    bias = source.stack_rows([Part(n, p.rows) for n, p in zip(names, parts, strict=True)])
    return bias.to(dtype)


class DenseFormat:
    name = "dense"

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def linear(self, source: WeightSource, parts: Sequence[Part], bias: bool) -> Linear:
        weight = source.stack_rows(parts).to(self.dtype)
        stacked = stacked_bias(source, parts, self.dtype) if bias else None
        if cpu_linear.packable(weight) and not source.shares_storage:  # fp32 on the CPU (cpu_linear.py)
            return cpu_linear.PackedLinear(weight, stacked)
        return DenseLinear(weight, stacked)
