"""Sampling tensors for the sampler's tests: rows that are greedy and ask for nothing unless told."""

from __future__ import annotations

import torch

from batchgen.engine.sampler import SamplingTensors

_INTS = ("top_k", "rng_keys", "rng_steps", "min_tokens", "state_rows")
_NEUTRAL = dict(
    temperature=0.0, top_p=1.0, top_k=0, min_p=0.0, rng_keys=1, repetition_penalty=1.0, presence_penalty=0.0,
    frequency_penalty=0.0, min_tokens=0,
)  # fmt: skip


def tensors(n: int, device: str = "cpu", **values) -> SamplingTensors:
    """``n`` sampled rows (state rows 0..n-1, output step 0 unless ``rng_steps`` says otherwise); each of
    ``values`` a scalar for every row or an [n] tensor."""
    given = {**_NEUTRAL, "rng_steps": 0, "state_rows": torch.arange(n), **values}
    fields = {}
    for name in SamplingTensors._fields[:-2]:
        value = given[name]
        dtype = torch.int64 if name in _INTS else torch.float32
        tensor = value if isinstance(value, torch.Tensor) else torch.full((n,), value)
        fields[name] = tensor.to(device=device, dtype=dtype)
    return SamplingTensors(**fields)


def fits(counts: torch.Tensor, probs: torch.Tensor, z: float = 4.75) -> bool:
    """Whether ``counts`` of independent draws (one per token) could come from ``probs``: Pearson's
    chi-square over the tokens expected 5+ times each and one bin for all the others, below the
    chi-square quantile at ``z`` standard normal deviations (4.75: a one-in-a-million false alarm;
    Wilson-Hilferty's approximation). The threshold follows from the sample size through the bins."""
    samples = float(counts.sum())
    expected = probs.double() * samples
    big = expected >= 5
    observed = torch.cat([counts.double()[big], counts.double()[~big].sum().reshape(1)])
    wanted = torch.cat([expected[big], expected[~big].sum().reshape(1)])
    if wanted[-1] < 5:  # the tail is too small for a bin of its own: it joins the smallest kept one
        smallest = int(wanted[:-1].argmin())
        observed[smallest] += observed[-1]
        wanted[smallest] += wanted[-1]
        observed, wanted = observed[:-1], wanted[:-1]
    statistic = float(((observed - wanted) ** 2 / wanted).sum())
    dof = len(wanted) - 1
    quantile = dof * (1 - 2 / (9 * dof) + z * (2 / (9 * dof)) ** 0.5) ** 3
    return statistic <= quantile
