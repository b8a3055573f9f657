"""Greedy fp32 output equals transformers' generate, token for token, under every scheduling regime."""

from __future__ import annotations

import pytest

from tests.engine.oracle import WORDS, make_prompts, reference_greedy, with_system_prompt
from tests.engine.regimes import NEW_TOKENS, REGIMES, check_model, greedy_run
from tests.support.models import DENSE_ARCHS


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
    check_model(tiny_models[arch], tiny_prompts, regime, tiny_expected[arch])


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
    check_model(default_model_path, smol_prompts, regime, smol_expected)


@pytest.mark.parametrize("model", ["tiny", "embedded"])
def test_shared_system_prompt_hits_prefix_cache(model, tiny_llama, default_model_path):
    from transformers import AutoTokenizer

    path = tiny_llama if model == "tiny" else default_model_path
    tokenizer = AutoTokenizer.from_pretrained(path)
    texts = [" ".join(WORDS[i : i + 5 + i % 7]) for i in range(12)]
    prompts = with_system_prompt(tokenizer, texts)
    expected = reference_greedy(path, prompts, NEW_TOKENS)
    got, llm = greedy_run(path, prompts, max_num_seqs=4)
    assert got == expected
    assert llm.stats.prefix_hit_rate > 0.3, llm.stats.prefix_hit_rate
