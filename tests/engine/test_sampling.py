"""Seeded sampling depends only on (model, row index, prompt, options, sample, seed)."""

from __future__ import annotations

import pytest
import torch

from batchgen import LLM, GenerationRequest, SamplingParams
from batchgen.engine.sampler import rng_key, sample
from batchgen.engine.step_sampling import SamplingFeatures
from tests.engine.sampling_cases import tensors

SAMPLED = SamplingParams(max_new_tokens=10, temperature=0.9, top_p=0.95, top_k=40, seed=7, ignore_eos=True)
PROMPTS = ["alpha beta", "the river runs", "one two three four five six", "question:", "a", "hello world"]


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(tiny_llama, max_num_seqs=4)


def _requests(llm, order, params=SAMPLED):
    return [GenerationRequest(i, llm.encode(PROMPTS[i], chat=False), params) for i in order]


def _by_index(outputs):
    return {(o.index, o.sample): o.token_ids for o in outputs}


def test_same_outputs_together_one_by_one_and_reordered(llm, tiny_llama):
    together = _by_index(llm.stream(_requests(llm, range(len(PROMPTS)))))
    one_by_one = {}
    for i in range(len(PROMPTS)):
        one_by_one.update(_by_index(llm.stream(_requests(llm, [i]))))
    reordered = _by_index(
        LLM(tiny_llama, max_num_seqs=2, async_mode=True).stream(_requests(llm, [5, 3, 1, 0, 2, 4]))
    )
    assert together == one_by_one == reordered
    assert len(set(map(tuple, together.values()))) > 1


def test_same_prompt_different_rows_differ(llm):
    ids = llm.encode("the same prompt", chat=False)
    outs = _by_index(llm.stream([GenerationRequest(i, ids, SAMPLED) for i in range(4)]))
    assert len({tuple(v) for v in outs.values()}) == 4


def test_n_samples_differ_and_share_the_prompt(tiny_llama):
    llm = LLM(tiny_llama, prefix_caching=False, block_size=4)
    ids = llm.encode(" ".join(["word"] * 40), chat=False)
    outs = list(llm.stream([GenerationRequest(0, ids, SamplingParams(**{**SAMPLED.__dict__, "n": 4}))]))
    assert sorted(o.sample for o in outs) == [0, 1, 2, 3]
    assert len({tuple(o.token_ids) for o in outs}) == 4
    assert llm.stats.prefix_hit_rate > 0.5  # samples 1..3 reuse sample 0's prompt blocks


def test_resumed_samples_equal_fresh_ones(llm):
    ids = llm.encode("resume me", chat=False)
    params = SamplingParams(**{**SAMPLED.__dict__, "n": 3})
    full = _by_index(llm.stream([GenerationRequest(9, ids, params)]))
    partial = _by_index(llm.stream([GenerationRequest(9, ids, params, samples=(2,))]))
    assert partial == {(9, 2): full[(9, 2)]}


def test_seed_changes_samples(llm):
    a = _by_index(llm.stream(_requests(llm, [0, 1, 2])))
    b = _by_index(llm.stream(_requests(llm, [0, 1, 2], SamplingParams(**{**SAMPLED.__dict__, "seed": 8}))))
    assert a != b


def _tensors(n, temperature, top_p=1.0, top_k=0, key=1):
    return tensors(
        n, temperature=temperature, top_p=top_p, top_k=top_k, rng_keys=key, rng_steps=torch.arange(n)
    )


SAMPLING, GREEDY_LOGPROBS = SamplingFeatures(sampling=True, truncation=True), SamplingFeatures(logprobs=True)


def test_sampler_matches_the_distribution():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().repeat(4000, 1)
    tokens = sample(logits, _tensors(4000, 1.0), SamplingFeatures(sampling=True)).tokens
    freq = torch.bincount(tokens, minlength=4).float() / 4000
    assert torch.allclose(freq, probs, atol=0.03), freq


def test_top_k_and_top_p_truncate():
    logits = torch.tensor([[2.0, 1.9, 1.8, 0.0]]).repeat(2000, 1)
    top2 = sample(logits, _tensors(2000, 1.0, top_k=2), SAMPLING).tokens
    assert set(top2.tolist()) == {0, 1}
    nucleus = sample(logits, _tensors(2000, 1.0, top_p=0.3), SAMPLING).tokens
    assert set(nucleus.tolist()) == {0}
    greedy_rows, logprobs, *_ = sample(logits[:3], _tensors(3, 0.0), GREEDY_LOGPROBS)
    assert greedy_rows.tolist() == [0, 0, 0]
    assert torch.allclose(logprobs, torch.log_softmax(logits[0], -1)[0].expand(3))


def test_greedy_in_the_model_dtype_picks_what_float32_picks():
    """Greedy steps skip widening the logits to float32. bf16 logits with many ties (few distinct values)
    pick the same first maximum, with or without a token mask, and the other paths see float32 logits."""
    torch.manual_seed(0)
    logits = (torch.randint(-4, 5, (64, 300)).float() / 4).to(torch.bfloat16)  # [S, V], ties everywhere
    wide = logits.float()
    greedy, mixed = _tensors(64, 0.0), _tensors(64, 0.8, top_k=5)
    mixed = mixed._replace(temperature=torch.where(torch.arange(64) % 2 == 0, 0.0, 0.8))
    mask = torch.randint(-(2**31), 2**31 - 1, (64, 10), dtype=torch.int32)  # [S, ceil(300 / 32)]
    logprobs_sampled = SamplingFeatures(sampling=True, truncation=True, logprobs=True)
    masked = greedy._replace(token_mask=mask)
    for params, features in ((greedy, SamplingFeatures()), (masked, SamplingFeatures()),
                             (greedy, GREEDY_LOGPROBS), (mixed, logprobs_sampled)):  # fmt: skip
        got, got_logprobs, *_ = sample(logits, params, features)
        want, want_logprobs, *_ = sample(wide, params, features)
        assert torch.equal(got, want)
        assert (got_logprobs is None and want_logprobs is None) or torch.equal(got_logprobs, want_logprobs)
        assert got_logprobs is None or got_logprobs.dtype == torch.float32


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_greedy_in_bf16_picks_the_first_maximum_as_float32_does():
    """On the GPU the argmax over a Llama-3-sized vocabulary is a reduction split across blocks: bf16
    logits with ties far apart, an all -inf row and a NaN row pick what their float32 widening picks."""
    torch.manual_seed(3)
    logits = (torch.randint(-8, 9, (64, 128256), device="cuda").float() / 8).to(torch.bfloat16)  # [S, V]
    logits[1, 5], logits[1, 128000] = 40, 40  # a tie between the two ends of the vocabulary
    logits[2] = float("-inf")
    logits[3, 777] = float("nan")
    greedy = tensors(64, device="cuda")
    got = sample(logits, greedy, SamplingFeatures()).tokens
    want = sample(logits.float(), greedy, SamplingFeatures()).tokens
    assert torch.equal(got, want) and got[1].item() == 5


def test_rng_key_separates_rows_samples_and_seeds():
    keys = {rng_key(s, i, k) for s in range(3) for i in range(50) for k in range(3)}
    assert len(keys) == 450


def test_noise_is_finite_and_truncation_holds_at_the_top_hash_value():
    from batchgen.engine.sampler import gumbel_noise

    noise = gumbel_noise(torch.tensor([12345]), torch.tensor([4]), 128256)
    assert torch.isfinite(noise).all()  # a 24-bit uniform rounded to 1.0 here gave +inf at one token
    logits = torch.full((1, 128256), -30.0)
    logits[0, :5] = 20.0
    params = tensors(1, temperature=0.7, top_p=0.9, top_k=5, rng_keys=12345, rng_steps=4)
    tokens = sample(logits, params, SAMPLING).tokens
    assert tokens.item() < 5


def test_top_p_one_cuts_nothing():
    from batchgen.engine.sampler import _truncate

    logits = torch.randn(4, 49152) * 4
    kept = _truncate(logits, torch.zeros(4, dtype=torch.int64), torch.ones(4))
    assert torch.isfinite(kept).all()
