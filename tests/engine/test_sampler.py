"""The sampler's parts (engine/sampler.py) against formulas written out here: logit bias and min_tokens,
the penalties (and transformers' own repetition penalty), min-p, log-probabilities, and the per-row token
statistics kept on the device from step to step (engine/row_tokens.py)."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from batchgen.config import MAX_LOGPROBS
from batchgen.engine import sampler
from batchgen.engine.row_tokens import RowTokens
from batchgen.engine.sampler import sample, score_prompt
from batchgen.engine.step_sampling import RowInit, SamplingFeatures
from tests.engine.sampling_cases import fits, tensors

V = 50


def _state(prompts: list[list[int]], outputs: list[list[int]], adjustments=None) -> RowTokens:
    state = RowTokens(len(prompts), V, torch.device("cpu"))
    adjustments = adjustments or [()] * len(prompts)
    state.init(
        [RowInit(r, p, o, a) for r, (p, o, a) in enumerate(zip(prompts, outputs, adjustments, strict=True))]
    )
    return state


def test_penalties_follow_the_formulas_and_transformers_repetition_penalty():
    torch.manual_seed(0)
    logits = torch.randn(3, V) * 3
    prompts, outputs = [[1, 2, 3], [4], []], [[5, 5, 5, 2], [], [7, 8, 7]]
    state = _state(prompts, outputs)
    rep = torch.tensor([1.3, 0.8, 2.0])
    presence, frequency = torch.tensor([0.5, -0.2, 0.0]), torch.tensor([0.3, 0.0, -1.0])
    params = tensors(3, repetition_penalty=rep, presence_penalty=presence, frequency_penalty=frequency)
    params = params._replace(row_tokens=state)
    want = logits.clone()
    for r in range(3):
        seen = (
            torch.tensor([prompts[r] + outputs[r]]) if prompts[r] + outputs[r] else torch.zeros(1, 0).long()
        )
        want[r : r + 1] = RepetitionPenaltyLogitsProcessor(float(rep[r]))(seen, want[r : r + 1].clone())
        for token in set(outputs[r]):
            count = outputs[r].count(token)
            want[r, token] -= frequency[r] * count + presence[r]
    assert torch.allclose(sampler._penalize(logits, params, torch.arange(3)), want)
    got = sample(logits, params, SamplingFeatures(penalties=True))
    assert got.tokens.tolist() == want.argmax(-1).tolist()
    # the sampled tokens are counted in their rows, for the next step
    for r, token in enumerate(got.tokens.tolist()):
        assert int(state.counts[r, token]) == outputs[r].count(token) + 1


def test_bias_is_added_and_min_tokens_hold_the_stop_ids_back_until_then():
    logits = torch.zeros(2, V)
    logits[:, 9] = 5.0  # the stop id wins unless held back
    adjustments = [((3, 2.0, False), (9, -math.inf, True)), ((4, 100.0, False),)]
    state = _state([[1], [1]], [[], []], adjustments)
    before = tensors(2, min_tokens=2, rng_steps=torch.tensor([1, 1]))._replace(row_tokens=state)
    features = SamplingFeatures(adjustments=True, logprobs=True)
    got = sample(logits, before, features)
    assert got.tokens.tolist() == [3, 4]  # 9 held back, bias 2 > 0; row 1's bias 100
    assert torch.allclose(got.logprobs, torch.log_softmax(logits, -1)[[0, 1], [3, 4]])  # raw: before bias
    after = before._replace(rng_steps=torch.tensor([2, 2]))
    assert sample(logits, after, features).tokens.tolist() == [9, 4]


def test_min_p_one_equals_greedy_and_min_p_cuts_the_unlikely():
    torch.manual_seed(1)
    logits = torch.randn(64, V) * 2
    sampled = tensors(64, temperature=0.9, min_p=1.0, rng_steps=torch.arange(64))
    assert torch.equal(sample(logits, sampled, SamplingFeatures(sampling=True)).tokens, logits.argmax(-1))
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    rows = probs.log().repeat(3000, 1)
    cut = tensors(3000, temperature=1.0, min_p=0.2, rng_steps=torch.arange(3000))
    tokens = sample(rows, cut, SamplingFeatures(sampling=True)).tokens
    assert set(tokens.tolist()) == {0, 1, 2}  # 0.05 < 0.2 x 0.5


def test_top_logprobs_are_the_raw_distributions_best():
    torch.manual_seed(2)
    logits = torch.randn(4, V)
    params = tensors(4, temperature=0.7, presence_penalty=2.0, rng_steps=torch.arange(4))
    params = params._replace(row_tokens=_state([[1]] * 4, [[0, 1, 2]] * 4))
    out = sample(
        logits, params, SamplingFeatures(sampling=True, logprobs=True, top_logprobs=True, penalties=True)
    )
    raw = torch.log_softmax(logits, -1)
    best = raw.topk(MAX_LOGPROBS, dim=-1)
    assert torch.equal(out.top_ids, best.indices) and torch.allclose(out.top_logprobs, best.values)
    assert torch.allclose(out.logprobs, raw.gather(1, out.tokens.unsqueeze(1)).squeeze(1))


def test_prompt_scores_are_log_softmax_at_the_previous_position():
    torch.manual_seed(3)
    logits, targets = torch.randn(5, V), torch.tensor([3, 1, 4, 1, 5])
    scores = score_prompt(logits, targets)
    raw = torch.log_softmax(logits, -1)
    assert torch.allclose(scores.logprobs, raw[torch.arange(5), targets])
    assert torch.equal(scores.top_ids, raw.topk(MAX_LOGPROBS, -1).indices)


def test_a_new_init_clears_what_the_rows_last_request_left():
    state = _state([[1, 2]], [[3, 3]], [((5, 1.0, False),)])
    state.init([RowInit(0, [7], [], ())])
    assert state.prompt[0].nonzero().flatten().tolist() == [7]
    assert int(state.counts[0].sum()) == 0 and not state.adjust_values[0].any()


@pytest.mark.parametrize("temperature, top_p", [(0.7, 1.0), (1.0, 0.8)])
def test_draws_follow_softmax_of_the_scaled_truncated_logits(temperature, top_p):
    """The tokens drawn for many independent rows fit exact sampling from softmax(logits / T) (cut to the
    top-p nucleus; a chi-square test whose threshold follows from the sample size), and do not fit the
    distribution of another temperature."""
    torch.manual_seed(4)
    logits = torch.randn(V) * 1.5
    n = 20000
    params = tensors(
        n,
        temperature=temperature,
        top_p=top_p,
        rng_keys=torch.arange(n),
        rng_steps=torch.zeros(n, dtype=torch.int64),
    )
    features = SamplingFeatures(sampling=True, truncation=top_p < 1)
    tokens = sample(logits.repeat(n, 1), params, features).tokens
    counts = torch.bincount(tokens, minlength=V)
    assert fits(counts, _expected(logits, temperature, top_p))
    assert not fits(counts, _expected(logits, 1.0 if temperature != 1.0 else 0.5, top_p))


def _expected(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    probs = torch.softmax(logits.double() / temperature, -1)
    order = probs.argsort(descending=True)
    before = torch.cumsum(probs[order], 0) - probs[order]
    keep = torch.zeros_like(probs, dtype=torch.bool)
    keep[order] = (before < top_p) if top_p < 1 else True
    kept = torch.where(keep, probs, 0.0)
    return kept / kept.sum()
