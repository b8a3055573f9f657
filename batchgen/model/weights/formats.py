"""How a projection's weights are stored and multiplied: the weight formats.

A format turns checkpoint tensors (``Part``s of a ``WeightSource``) into a ``Linear``: a callable
``[T, in] -> [T, out]``. Several parts stack along the output rows (q|k|v, gate|up), each already cut
to the rank's shard. Embeddings, norms and the LM head are not projections: they stay dense.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
import torch.nn.functional as F

from batchgen.model.weights.sources import Part, WeightSource


class Linear(Protocol):
    out_features: int

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...  # [T, in] -> [T, out]


class DenseLinear:
    """A plain weight in the model dtype (``F.linear``, so bf16 rounds as transformers' layers do)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight, self.bias = weight, bias  # [out, in], [out]
        self.out_features = weight.shape[0]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


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
        return DenseLinear(weight, stacked_bias(source, parts, self.dtype) if bias else None)


def weight_format(hf_config, dtype: torch.dtype, quantization: str | None = None) -> WeightFormat:
    """The format of a checkpoint's projections (``quantization``: what the user asked for at load)."""
    method = quantization_method(hf_config)
    if method is not None:
        raise ValueError(f"quantization method {method!r} is not supported")
    if quantization is not None:
        raise ValueError(f"unknown quantization {quantization!r}")
    return DenseFormat(dtype)


def quantization_method(hf_config) -> str | None:
    qc = getattr(hf_config, "quantization_config", None)
    if qc is None:
        return None
    method = qc.get("quant_method") if isinstance(qc, dict) else getattr(qc, "quant_method", None)
    return str(getattr(method, "value", method) or "unknown")
