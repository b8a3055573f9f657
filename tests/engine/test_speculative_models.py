"""Speculative decoding on real forwards in float32 on the CPU, against plain decoding of the same model
as the oracle: greedy and sampled output token-identical under queueing, chunked prefills, preemption and
the asynchronous loop; every sampling option beside it; and guessed positions' samples following the
model's scaled distribution (a chi-square test against transformers' logits)."""

from __future__ import annotations

import pytest
import torch

from batchgen import LLM, SamplingParams
from batchgen.bench.rewrite import rewrite_messages
from tests.engine.regimes import REGIMES, tiny_kv_bytes
from tests.engine.sampling_cases import fits
from tests.engine.speculative_cases import SPECULATE, copying_prompts

one_thread = pytest.mark.usefixtures("one_torch_thread")  # tiny models: threads only spin


def _outputs(llm: LLM, prompts, params: SamplingParams) -> list:
    return [(o.token_ids, o.finish_reason) for o in llm.generate_samples(prompts, params)]


@one_thread
@pytest.mark.parametrize("regime", ["queueing", "chunked_prefill", "tiny_kv", "async"])
def test_tiny_model_greedy_is_unchanged(tiny_llama, regime):
    prompts = copying_prompts(24, seed=1)
    params = SamplingParams(max_new_tokens=40, ignore_eos=True)
    options = dict(REGIMES[regime])
    if regime == "tiny_kv":
        options["kv_cache_bytes"] = tiny_kv_bytes(LLM(tiny_llama, kv_cache_bytes=1 << 20), 220)
    want = _outputs(LLM(tiny_llama, **options), prompts, params)
    llm = LLM(tiny_llama, **options, **SPECULATE)
    assert _outputs(llm, prompts, params) == want
    stats = llm.stats
    assert stats.verify_steps > 0 and stats.accepted_tokens > 0 and stats.draft_tokens > stats.accepted_tokens
    if regime == "tiny_kv":
        assert stats.preemptions > 0
    if regime == "chunked_prefill":
        assert stats.partial_prefills > 0


SAMPLING_CASES = {
    "sampled": dict(temperature=0.8, top_p=0.9, top_k=40, min_p=0.02, n=2),
    "logprobs": dict(logprobs=3),
    "stops": dict(stop_token_ids=[250, 251, 252], min_tokens=5, logit_bias={260: 4.0, 261: -50.0}),
    "penalties": dict(repetition_penalty=1.3, frequency_penalty=0.2, presence_penalty=0.1),
    "choices": dict(choices=["alpha beta gamma", "alpha beta delta"]),
}


@one_thread
@pytest.mark.parametrize("async_mode", [False, True])
@pytest.mark.parametrize("case", sorted(SAMPLING_CASES))
def test_tiny_model_sampling_options_are_unchanged(tiny_llama, case, async_mode):
    """The draws of a verified position are the row's own draws there (its seed, its output index), so
    sampled output is token-identical too; penalised and constrained rows decode one token a step. In the
    asynchronous loop verify steps chain (a rejection voids the row's part of the next step)."""
    prompts = copying_prompts(12, seed=2)
    params = SamplingParams(max_new_tokens=30, ignore_eos=True, seed=5, **SAMPLING_CASES[case])
    plain = LLM(tiny_llama, max_num_seqs=6, async_mode=async_mode).generate_samples(prompts, params)
    llm = LLM(tiny_llama, max_num_seqs=6, async_mode=async_mode, **SPECULATE)
    spec = llm.generate_samples(prompts, params)
    assert [o.token_ids for o in spec] == [o.token_ids for o in plain]
    assert [o.finish_reason for o in spec] == [o.finish_reason for o in plain]
    if case == "logprobs":
        for a, b in zip(spec, plain, strict=True):
            assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
            assert [[t for t, _ in top] for top in a.top_logprobs] == [
                [t for t, _ in top] for top in b.top_logprobs
            ]
    if case in ("penalties", "choices"):
        assert llm.stats.draft_tokens == 0  # such rows never guess
    else:  # a random model's samples rarely follow its prompt: acceptance is asserted where greedy
        assert llm.stats.draft_tokens > 0 and (case == "sampled" or llm.stats.accepted_tokens > 0)


@pytest.fixture(scope="module")
def rewrite_prompts(default_model_path):
    """26 chat requests to copy or lightly edit a paragraph (B8's prompts, bench/rewrite.py, with shorter
    paragraphs: 100-200 tokens a prompt)."""
    llm = LLM(default_model_path, max_num_seqs=2)
    return [llm.encode(messages) for messages in rewrite_messages(26, seed=7, sentences=(3, 5))]


@pytest.mark.parametrize("regime", ["chunked", "preempting", "chained"])
def test_embedded_model_greedy_is_unchanged_on_a_rewrite_job(default_model_path, rewrite_prompts, regime):
    """The embedded model copying paragraphs: most guesses are accepted, and the output is plain greedy's,
    token for token, with prompts cut into chunks (a 96-token budget), rows preempted (a small cache), or
    both in the asynchronous loop, where verify steps chain."""
    params = SamplingParams(max_new_tokens=40)
    options = dict(max_num_seqs=13, max_batch_tokens=96)
    if regime in ("preempting", "chained"):
        probe = LLM(default_model_path, kv_cache_bytes=1 << 22)
        options = dict(max_num_seqs=13, kv_cache_bytes=tiny_kv_bytes(probe, 800))
    if regime == "chained":
        options.update(max_batch_tokens=96, async_mode=True)
    want = _outputs(LLM(default_model_path, **options), rewrite_prompts, params)
    llm = LLM(default_model_path, **options, **SPECULATE)
    got = _outputs(llm, rewrite_prompts, params)
    differ = [i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w]
    assert not differ, f"prompts {differ} differ"
    print(f"{regime}: acceptance {llm.stats.acceptance_rate}, {llm.stats.accepted_per_verify_step} a step")
    assert llm.stats.acceptance_rate > 0.5, llm.stats.acceptance_rate
    if regime != "chunked":
        assert llm.stats.preemptions > 0
    if regime != "preempting":
        assert llm.stats.partial_prefills > 0
    if regime == "chained":
        assert llm.stats.void_rows > 0 and llm.stats.overlapped_steps > llm.stats.verify_steps // 2


def test_guessed_positions_sample_the_models_scaled_distribution(default_model_path):
    """Many samples of a prompt that repeats a sentence, three tokens each: among those whose first two
    tokens are the most common pair, the third (drawn at a guessed position when the second equalled the
    guess) fits softmax(logits / T) of transformers' forward over that prefix, and not the unscaled one."""
    from transformers import AutoModelForCausalLM

    llm = LLM(default_model_path, max_num_seqs=256, **SPECULATE)
    prompt = llm.encode("the cat sat on the mat. the cat sat on the mat. the cat sat on the", chat=False)
    temperature = 0.7
    params = SamplingParams(max_new_tokens=3, temperature=temperature, n=800, seed=11, ignore_eos=True)
    outs = [o.token_ids for o in llm.generate_samples([prompt], params)]
    assert llm.stats.accepted_tokens > 0
    pair = max({tuple(o[:2]) for o in outs}, key=lambda p: sum(tuple(o[:2]) == p for o in outs))
    thirds = torch.tensor([o[2] for o in outs if tuple(o[:2]) == pair])
    assert len(thirds) > 200
    hf = AutoModelForCausalLM.from_pretrained(default_model_path, dtype=torch.float32).eval()
    with torch.inference_mode():
        logits = hf(torch.tensor([prompt + list(pair)])).logits[0, -1].double()
    counts = torch.bincount(thirds, minlength=logits.shape[0])
    assert fits(counts, torch.softmax(logits / temperature, -1))
    assert not fits(counts, torch.softmax(logits, -1))


@one_thread
@pytest.mark.parametrize("async_mode", [False, True])
def test_constrained_rows_beside_speculating_ones_keep_their_grammar(tiny_llama, async_mode):
    """Rows with a grammar (``choices``) among rows that guess: a constrained row never joins a verify step
    (its masks are filled per sampled row, one a row), so both kinds of row give plain decoding's output."""
    prompts = copying_prompts(16, seed=3)
    free = SamplingParams(max_new_tokens=30, ignore_eos=True)
    chosen = SamplingParams(max_new_tokens=30, choices=["alpha beta gamma", "alpha beta delta"])
    params = [chosen if i % 4 == 3 else free for i in range(len(prompts))]
    plain = LLM(tiny_llama, max_num_seqs=4, async_mode=async_mode).generate_samples(prompts, params)
    llm = LLM(tiny_llama, max_num_seqs=4, async_mode=async_mode, **SPECULATE)
    spec = llm.generate_samples(prompts, params)
    assert [(o.token_ids, o.finish_reason, o.error) for o in spec] == [
        (o.token_ids, o.finish_reason, o.error) for o in plain
    ]
    assert llm.stats.verify_steps > 0 and not any(o.error for o in spec)
