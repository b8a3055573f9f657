"""Batched sampling with per-row parameters and counter-based randomness (no host syncs).

Noise is a pure function of (row key, output step, token id): a hash, not a generator state. So a
row's samples do not depend on which other rows shared its batches, and CPU and CUDA draw the same
noise. Sampling is Gumbel-max over the temperature-scaled, top-k/top-p-truncated logits.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from batchgen.engine.grammar import apply_token_mask

_MASK32 = 0xFFFFFFFF


class SamplingTensors(NamedTuple):
    temperature: torch.Tensor  # [S] float32, 0 = greedy
    top_p: torch.Tensor  # [S] float32
    top_k: torch.Tensor  # [S] int64, 0 = off
    rng_keys: torch.Tensor  # [S] int64
    rng_steps: torch.Tensor  # [S] int64
    # [S, W] int32 bitmask of the tokens each row may take (structured output, engine/grammar.py); an
    # all-ones row is unconstrained. None: no row of the step is constrained.
    token_mask: torch.Tensor | None = None


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser (lowbias32) in int64 arithmetic: products stay below 2**63."""
    x = x & _MASK32
    x = x ^ (x >> 16)
    x = (x * 0x21F0AAAD) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x735A2D97) & _MASK32
    return x ^ (x >> 15)


def gumbel_noise(keys: torch.Tensor, steps: torch.Tensor, vocab: int) -> torch.Tensor:
    """[S, vocab] float32 Gumbel(0, 1) noise from (key, step, token id)."""
    row = _mix32(keys * 0x5BD1E995 + _mix32(steps + 0x9E3779B9))  # [S]
    token = torch.arange(vocab, device=keys.device, dtype=torch.int64)  # [V]
    bits = _mix32(row.unsqueeze(1) ^ _mix32(token * 0x27D4EB2F + 0x165667B1).unsqueeze(0))  # [S, V]
    # 23 bits + 0.5 are exact in float32, so uniform stays strictly inside (0, 1): a 24-bit value
    # would round up to 1.0 at the top and give +inf noise that wins over any truncation.
    uniform = ((bits >> 9).to(torch.float32) + 0.5) * (1.0 / (1 << 23))
    return -torch.log(-torch.log(uniform))


def rng_key(seed: int, index: int, sample: int) -> int:
    """Per-(row, sample) 31-bit key; two rows with the same prompt get different keys."""
    h = (seed * 0x9E3779B1 + 0x7F4A7C15) & _MASK32
    for value in (index & _MASK32, index >> 32, sample):
        h = ((h ^ value) * 0x85EBCA6B + 0xC2B2AE35) & _MASK32
        h ^= h >> 13
    return h & 0x7FFFFFFF


def _truncate(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Set logits outside each row's top-k / top-p set to -inf. scaled: [S, V]."""
    sorted_logits, order = torch.sort(scaled, dim=-1, descending=True, stable=True)
    vocab = scaled.shape[-1]
    ranks = torch.arange(vocab, device=scaled.device).unsqueeze(0)  # [1, V]
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab)).unsqueeze(1)  # [S, 1]
    cut = ranks >= k
    probs = torch.softmax(sorted_logits.masked_fill(cut, float("-inf")), dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs  # probability of strictly better tokens
    # top_p == 1 cuts nothing (a float32 cumsum can reach 1.0 before the tail ends).
    cut |= (mass_before >= top_p.unsqueeze(1)) & (top_p < 1).unsqueeze(1)
    cut[:, 0] = False  # the best token always survives
    sorted_logits = sorted_logits.masked_fill(cut, float("-inf"))
    return torch.empty_like(scaled).scatter_(1, order, sorted_logits)


def _argmax(logits: torch.Tensor) -> torch.Tensor:
    """[S, V] -> [S], torch.argmax's answer; on CUDA by two Triton passes over column blocks
    (``kernels/argmax.py``: torch's one block a row took 34 us of B1's 5.7 ms FP8 step)."""
    if logits.is_cuda and logits.stride(-1) == 1:
        from batchgen.kernels.argmax import row_argmax  # Triton: installed with CUDA builds only

        return row_argmax(logits)
    return torch.argmax(logits, dim=-1)


def sample(
    logits: torch.Tensor,  # [S, V] in the model's dtype or float32
    params: SamplingTensors,
    any_sampling: bool,
    want_logprobs: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Sampled token ids [S] and, when asked, their log-probabilities under the model [S] (before the
    token mask, temperature and truncation, like vLLM's raw log-probabilities).

    Greedy steps take the argmax in the logits' own dtype: widening to float32 is exact, so the pick is
    the same, and a small model's step skips a [S, V] float32 copy (B7: ~45 us of a ~1.5 ms step)."""
    if any_sampling or want_logprobs:
        logits = logits.float()
    raw = logits
    if params.token_mask is not None:
        logits = apply_token_mask(logits, params.token_mask)
    greedy = _argmax(logits)
    tokens = greedy
    if any_sampling:
        temperature = torch.where(
            params.temperature > 0, params.temperature, torch.ones_like(params.temperature)
        )
        scaled = _truncate(logits / temperature.unsqueeze(1), params.top_k, params.top_p)
        noisy = scaled + gumbel_noise(params.rng_keys, params.rng_steps, logits.shape[-1])
        tokens = torch.where(params.temperature > 0, torch.argmax(noisy, dim=-1), greedy)
    logprobs = None
    if want_logprobs:
        logprobs = torch.log_softmax(raw, dim=-1).gather(1, tokens.unsqueeze(1)).squeeze(1)
    return tokens, logprobs
