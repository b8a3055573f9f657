"""Greedy fp32 output equals transformers' generate, token for token, under every scheduling regime."""

from __future__ import annotations

import pytest

from batchgen import LLM, SamplingParams
from batchgen.model.forward import TransformersForward
from batchgen.model.fused import FusedForward
from tests.engine.oracle import WORDS, make_prompts, reference_greedy, with_system_prompt
from tests.support.models import DENSE_ARCHS

NEW_TOKENS = 12
GREEDY = SamplingParams(max_new_tokens=NEW_TOKENS)  # EOS stops both sides alike

# name -> engine options; "tiny_kv" is sized per model below so that preemption must happen.
REGIMES = {
    "queueing": dict(max_num_seqs=3),
    "chunked_prefill": dict(max_batch_tokens=64, max_num_seqs=8),
    "tiny_kv": dict(max_num_seqs=16),
    "async": dict(max_num_seqs=6, max_batch_tokens=96, async_mode=True),
    # The regimes above run batchgen's fused forward; this one transformers' modelling code.
    "transformers_forward": dict(max_num_seqs=6, max_batch_tokens=96, model_impl="transformers"),
}


def _tiny_kv_bytes(llm_probe: LLM, tokens: int) -> int:
    per_block = (
        llm_probe._engine.runner.kv_caches[0][0][0].numel() * 4 * 2 * len(llm_probe._engine.runner.kv_caches)
    )
    return per_block * (-(-tokens // llm_probe.config.block_size))


def _run(path: str, prompts, **options) -> tuple[list[list[int]], LLM]:
    llm = LLM(path, **options)
    outputs = llm.generate_samples(prompts, GREEDY)
    assert [o.index for o in outputs] == list(range(len(prompts)))
    return [o.token_ids for o in outputs], llm


def _check_model(path: str, prompts: list[list[int]], regime: str, expected: list[list[int]]) -> None:
    options = dict(REGIMES[regime])
    if regime == "tiny_kv":
        probe = LLM(path, kv_cache_bytes=1 << 20)
        longest = max(len(p) for p in prompts) + NEW_TOKENS
        options["kv_cache_bytes"] = _tiny_kv_bytes(probe, int(longest * 1.15))
    got, llm = _run(path, prompts, **options)
    expected_forward = TransformersForward if regime == "transformers_forward" else FusedForward
    assert isinstance(llm._engine.runner.forward, expected_forward)
    mismatched = [i for i, (g, e) in enumerate(zip(got, expected, strict=True)) if g != e]
    assert not mismatched, (
        f"{regime}: prompts {mismatched} differ, first: {got[mismatched[0]]} vs {expected[mismatched[0]]}"
    )
    if regime == "tiny_kv":
        assert llm.stats.preemptions > 0, "the tiny KV pool should have forced preemption"
    if regime == "chunked_prefill":
        budget = REGIMES[regime]["max_batch_tokens"]
        assert max(len(p) for p in prompts) > budget  # so some prompt cannot fit one step
        assert llm.stats.partial_prefills > 0, "no prefill was split over several steps"
        assert llm.stats.max_step_tokens <= budget, f"a step ran {llm.stats.max_step_tokens} tokens"


@pytest.fixture(scope="module")
def tiny_prompts(tiny_llama):
    from transformers import AutoTokenizer

    return make_prompts(AutoTokenizer.from_pretrained(tiny_llama), count=32, max_tokens=400)


@pytest.fixture(scope="module")
def tiny_expected(tiny_models, tiny_prompts):
    return {arch: reference_greedy(tiny_models[arch], tiny_prompts, NEW_TOKENS) for arch in DENSE_ARCHS}


@pytest.mark.parametrize("regime", list(REGIMES))
@pytest.mark.parametrize("arch", DENSE_ARCHS)
def test_tiny_models_match_transformers(tiny_models, tiny_prompts, tiny_expected, arch, regime):
    _check_model(tiny_models[arch], tiny_prompts, regime, tiny_expected[arch])


@pytest.fixture(scope="module")
def smol_prompts(default_model_path):
    from transformers import AutoTokenizer

    # 24 prompts up to 640 tokens (seed 1: lengths whose tiny KV pool preempts twice) still cross every
    # regime's limits; fp32 prefill of the 135M model on CI's two cores is most of this file's time.
    return make_prompts(AutoTokenizer.from_pretrained(default_model_path), count=24, max_tokens=640, seed=1)


@pytest.fixture(scope="module")
def smol_expected(default_model_path, smol_prompts):
    return reference_greedy(default_model_path, smol_prompts, NEW_TOKENS)


@pytest.mark.parametrize("regime", list(REGIMES))
def test_embedded_model_matches_transformers(default_model_path, smol_prompts, smol_expected, regime):
    _check_model(default_model_path, smol_prompts, regime, smol_expected)


@pytest.mark.parametrize("model", ["tiny", "embedded"])
def test_shared_system_prompt_hits_prefix_cache(model, tiny_llama, default_model_path):
    from transformers import AutoTokenizer

    path = tiny_llama if model == "tiny" else default_model_path
    tokenizer = AutoTokenizer.from_pretrained(path)
    texts = [" ".join(WORDS[i : i + 5 + i % 7]) for i in range(12)]
    prompts = with_system_prompt(tokenizer, texts)
    expected = reference_greedy(path, prompts, NEW_TOKENS)
    got, llm = _run(path, prompts, max_num_seqs=4)
    assert got == expected
    assert llm.stats.prefix_hit_rate > 0.3, llm.stats.prefix_hit_rate
