"""scripts/gptq.py: GPTQ rounding to e4m3 under fixed row scales."""

from __future__ import annotations

import pytest
import torch

from batchgen.kernels import fp8_format
from scripts.gptq import gptq_round


def _layer(seed: int, n: int = 48, k: int = 160, tokens: int = 512):
    """A random weight and inputs whose columns are correlated (mixed through a random matrix)."""
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(n, k, generator=gen)
    x = torch.randn(tokens, k, generator=gen) @ torch.randn(k, k, generator=gen) + torch.randn(
        k, generator=gen
    )
    return weight, x, fp8_format.quantize_rows(weight)[1]


def test_identity_hessian_rounds_to_nearest():
    weight, _, scale = _layer(0)
    nearest, _ = fp8_format.quantize_rows(weight)
    got = gptq_round(weight, scale, torch.eye(weight.shape[1]), block=64)  # blocks not dividing k
    assert torch.equal(got.view(torch.uint8), nearest.view(torch.uint8))


@pytest.mark.parametrize("seed", range(4))
def test_never_worse_than_nearest_on_the_layer_output(seed):
    weight, x, scale = _layer(seed)
    nearest, _ = fp8_format.quantize_rows(weight)

    def error(q: torch.Tensor) -> float:
        return float((x.double() @ (weight.double() - q.double() * scale.double()[:, None]).T).square().sum())

    rounded = gptq_round(weight, scale, x.double().T @ x.double(), block=64)
    assert error(rounded) < 0.9 * error(nearest)
