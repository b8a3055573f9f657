"""Batched sampling with per-row parameters and counter-based randomness (no host syncs).

Per step, in vLLM's order: the logits' log-probabilities first (the model's raw distribution), then the
token masks of structured output, the fixed per-token adjustments (logit bias; the stop tokens held back
until min_tokens), the penalties (repetition, frequency, presence), and for the rows that sample:
temperature, min-p, top-k and top-p, then a draw. Greedy rows take the argmax of the adjusted logits.

Noise is a pure function of (row key, output step, token id): a hash, not a generator state. So a
row's samples do not depend on which other rows shared its batches, and CPU and CUDA draw the same
noise. Sampling is Gumbel-max over the temperature-scaled, truncated logits.

Which of these parts a step runs is its ``SamplingFeatures``: on when some sampled row uses it, so rows
that use none of them pay nothing, and a captured graph is one variant.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch

from batchgen.config import MAX_LOGPROBS
from batchgen.engine.grammar import apply_token_mask
from batchgen.engine.row_tokens import RowTokens
from batchgen.engine.step_sampling import GREEDY, SamplingFeatures

if TYPE_CHECKING:
    from batchgen.kernels.sampling.fused_sampler import Draws, Penalties

_MASK32 = 0xFFFFFFFF


class SamplingTensors(NamedTuple):
    temperature: torch.Tensor  # [S] float32, 0 = greedy
    top_p: torch.Tensor  # [S] float32
    top_k: torch.Tensor  # [S] int64, 0 = off
    min_p: torch.Tensor  # [S] float32, 0 = off
    rng_keys: torch.Tensor  # [S] int64
    rng_steps: torch.Tensor  # [S] int64: the index of the output token each row draws
    repetition_penalty: torch.Tensor  # [S] float32, 1 = off
    presence_penalty: torch.Tensor  # [S] float32
    frequency_penalty: torch.Tensor  # [S] float32
    min_tokens: torch.Tensor  # [S] int64
    state_rows: torch.Tensor  # [S] int64: each row's row of ``RowTokens`` (-1: padding)
    # [S, W] int32 bitmask of the tokens each row may take (structured output, engine/grammar.py); an
    # all-ones row is unconstrained. None: no row of the step is constrained.
    token_mask: torch.Tensor | None = None
    row_tokens: RowTokens | None = None  # the per-row statistics (stateful features only)


class SampleOutput(NamedTuple):
    tokens: torch.Tensor  # [S] int64
    logprobs: torch.Tensor | None = None  # [S] float32: the sampled tokens' under the raw distribution
    top_ids: torch.Tensor | None = None  # [S, MAX_LOGPROBS] int64, most likely first
    top_logprobs: torch.Tensor | None = None  # [S, MAX_LOGPROBS] float32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser (lowbias32) in int64 arithmetic: products stay below 2**63."""
    x = x & _MASK32
    x = x ^ (x >> 16)
    x = (x * 0x21F0AAAD) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x735A2D97) & _MASK32
    return x ^ (x >> 15)


def row_hash(keys: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """[S] int64 in [0, 2**32): the noise's hash of each row's (key, output step)."""
    return _mix32(keys * 0x5BD1E995 + _mix32(steps + 0x9E3779B9))


def gumbel_noise(keys: torch.Tensor, steps: torch.Tensor, vocab: int) -> torch.Tensor:
    """[S, vocab] float32 Gumbel(0, 1) noise from (key, step, token id)."""
    row = row_hash(keys, steps)  # [S]
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


def _adjust(logits: torch.Tensor, params: SamplingTensors, rows: torch.Tensor) -> torch.Tensor:
    """Each row's sparse logit changes: its bias, and -inf on its stop ids while min_tokens holds them.
    logits [S, V] float32; rows [S] rows of ``RowTokens``."""
    state = params.row_tokens
    ids, values, gated = state.adjust_ids[rows], state.adjust_values[rows], state.adjust_gated[rows]  # [S, A]
    held = (params.rng_steps < params.min_tokens).unsqueeze(1)  # [S, 1]: still before min_tokens
    return logits.scatter_add(1, ids, torch.where(gated & ~held, 0.0, values))


def _penalize(logits: torch.Tensor, params: SamplingTensors, rows: torch.Tensor) -> torch.Tensor:
    """vLLM's penalties. Repetition: over tokens of the prompt or the output, positive logits divided by
    it, negative ones multiplied. Frequency: minus it per earlier output of the token; presence: minus it
    once for a token output at all. logits [S, V] float32."""
    state = params.row_tokens
    counts = state.counts[rows]  # [S, V] int32
    output = counts > 0  # [S, V]
    seen = state.prompt[rows] | output
    repetition = params.repetition_penalty.unsqueeze(1)  # [S, 1]
    penalized = torch.where(logits > 0, logits / repetition, logits * repetition)
    logits = torch.where(seen, penalized, logits)
    logits = logits - params.frequency_penalty.unsqueeze(1) * counts
    return logits - params.presence_penalty.unsqueeze(1) * output


def _min_p(scaled: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop tokens whose probability is below min_p x the most likely token's: p / p_max is
    exp(scaled - max). scaled [S, V]."""
    ratio = torch.exp(scaled - scaled.max(dim=-1, keepdim=True).values)  # [S, V]
    return scaled.masked_fill(ratio < min_p.unsqueeze(1), float("-inf"))


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
    (``kernels/sampling/argmax.py``: torch's one block a row was slow on a decode step's few rows)."""
    if logits.is_cuda and logits.stride(-1) == 1:
        from batchgen.kernels.sampling.argmax import row_argmax  # Triton: installed with CUDA builds only

        return row_argmax(logits)
    return torch.argmax(logits, dim=-1)


def _draw(logits: torch.Tensor, params: SamplingTensors, features: SamplingFeatures) -> torch.Tensor:
    """The sampling rows' draws (greedy rows get any token: the caller picks): temperature, min-p, top-k
    and top-p, then Gumbel-max. logits [S, V] float32."""
    temperature = torch.where(params.temperature > 0, params.temperature, torch.ones_like(params.temperature))
    scaled = _min_p(logits / temperature.unsqueeze(1), params.min_p)
    if features.truncation:
        scaled = _truncate(scaled, params.top_k, params.top_p)
    noisy = scaled + gumbel_noise(params.rng_keys, params.rng_steps, logits.shape[-1])
    return torch.argmax(noisy, dim=-1)


class PromptScores(NamedTuple):
    logprobs: torch.Tensor  # [P] float32: each scored prompt token's log-probability
    top_ids: torch.Tensor  # [P, MAX_LOGPROBS] int64: the most likely tokens at its position
    top_logprobs: torch.Tensor  # [P, MAX_LOGPROBS] float32


def score_prompt(logits: torch.Tensor, targets: torch.Tensor) -> PromptScores:
    """The raw log-probabilities of prompt tokens ``targets`` [P] under the logits of the positions before
    them [P, V], and the most likely tokens there."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)  # [P, V]
    top = torch.topk(logprobs, MAX_LOGPROBS, dim=-1)
    return PromptScores(logprobs.gather(1, targets.unsqueeze(1)).squeeze(1), top.indices, top.values)


def sample(
    logits: torch.Tensor,  # [S, V] in the model's dtype or float32
    params: SamplingTensors,
    features: SamplingFeatures,
    fused: bool | None = None,
) -> SampleOutput:
    """Sampled token ids [S] and what ``features`` asks for besides: the sampled tokens' log-probabilities
    and the most likely tokens' under the model (before masks, penalties, temperature and truncation,
    like vLLM's raw log-probabilities).

    ``fused``: through the Triton kernels of ``kernels/sampling/`` (default: on CUDA, for the steps
    without top-k / top-p, which need a sort). Greedy steps without adjustments take the argmax in the
    logits' own dtype: widening to float32 is exact, so the pick is the same, and a small model's step
    skips a [S, V] float32 copy."""
    if fused is None:
        fused = logits.is_cuda and logits.stride(-1) == 1 and not features.truncation
    if fused and features != GREEDY:
        return _sample_fused(logits, params, features)
    if features.sampling or features.logprobs or features.stateful:
        logits = logits.float()
    raw = logits
    if params.token_mask is not None:
        logits = apply_token_mask(logits, params.token_mask)
    if features.stateful:
        rows = params.row_tokens.index(params.state_rows)
        if features.adjustments:
            logits = _adjust(logits, params, rows)
        if features.penalties:
            logits = _penalize(logits, params, rows)
    tokens = _argmax(logits)
    if features.sampling:
        tokens = torch.where(params.temperature > 0, _draw(logits, params, features), tokens)
    if features.penalties:
        params.row_tokens.record(rows, tokens)
    if not features.logprobs:
        return SampleOutput(tokens)
    logprobs = torch.log_softmax(raw, dim=-1)  # [S, V]
    chosen = logprobs.gather(1, tokens.unsqueeze(1)).squeeze(1)
    if not features.top_logprobs:
        return SampleOutput(tokens, chosen)
    top = torch.topk(logprobs, MAX_LOGPROBS, dim=-1)
    return SampleOutput(tokens, chosen, top.indices, top.values)


def _sample_fused(logits: torch.Tensor, params: SamplingTensors, features: SamplingFeatures) -> SampleOutput:
    """``sample`` with the penalties, temperature, min-p, draw and log-normaliser in two reads of the
    logits; the sparse adjustments and token masks first, on a float32 copy (only when a row has them)."""
    from batchgen.kernels.sampling.fused_sampler import pick_tokens  # Triton: installed with CUDA builds only

    raw = logits  # [S, V]
    if params.token_mask is not None or features.adjustments:
        logits = logits.float()
    if params.token_mask is not None:
        logits = apply_token_mask(logits, params.token_mask)
    rows = params.row_tokens.index(params.state_rows) if features.stateful else None
    if features.adjustments:
        logits = _adjust(logits, params, rows)
    picks = pick_tokens(
        logits, raw, _penalties(params, rows, features), _draws(params, features), features.logprobs
    )
    if features.penalties:
        params.row_tokens.record(rows, picks.tokens)
    if not features.top_logprobs:
        return SampleOutput(picks.tokens, picks.logprobs)
    top = torch.topk(raw, MAX_LOGPROBS, dim=-1)  # the raw logits' order is their log-probabilities'
    return SampleOutput(
        picks.tokens, picks.logprobs, top.indices, top.values.float() - picks.log_norm.unsqueeze(1)
    )


def _penalties(
    params: SamplingTensors, rows: torch.Tensor | None, features: SamplingFeatures
) -> Penalties | None:
    if not features.penalties:
        return None
    from batchgen.kernels.sampling.fused_sampler import Penalties

    state = params.row_tokens
    return Penalties(
        state.counts,
        state.prompt,
        rows,
        params.repetition_penalty,
        params.frequency_penalty,
        params.presence_penalty,
    )


def _draws(params: SamplingTensors, features: SamplingFeatures) -> Draws | None:
    if not features.sampling:
        return None
    from batchgen.kernels.sampling.fused_sampler import Draws

    return Draws(params.temperature, params.min_p, row_hash(params.rng_keys, params.rng_steps))
