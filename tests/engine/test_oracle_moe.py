"""Mixture-of-experts models on batchgen's fused forward: greedy fp32 output equals transformers'
generate one prompt at a time, token for token, under queueing, chunked prefill, preemption and the
asynchronous loop, and with tensor parallelism."""

from __future__ import annotations

import pytest

from tests.engine.oracle import make_prompts, reference_greedy
from tests.engine.regimes import NEW_TOKENS, check_model
from tests.support.models import MOE_ARCHS

pytestmark = pytest.mark.usefixtures("one_torch_thread")
REGIMES = ("queueing", "chunked_prefill", "tiny_kv", "async")


@pytest.fixture(scope="module")
def moe_prompts(tiny_llama):
    from transformers import AutoTokenizer

    return make_prompts(AutoTokenizer.from_pretrained(tiny_llama), count=24, max_tokens=400, seed=3)


@pytest.fixture(scope="module")
def moe_expected(tiny_models, moe_prompts):
    return {arch: reference_greedy(tiny_models[arch], moe_prompts, NEW_TOKENS) for arch in MOE_ARCHS}


@pytest.mark.parametrize("regime", REGIMES)
@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_tiny_moe_models_match_transformers(tiny_models, moe_prompts, moe_expected, arch, regime):
    check_model(tiny_models[arch], moe_prompts, regime, moe_expected[arch])


@pytest.mark.parametrize("arch", ["olmoe", "qwen2_moe"])
def test_tensor_parallel_moe_matches_transformers(tiny_models, moe_prompts, moe_expected, arch):
    """Two processes (gloo): experts and the shared expert split by intermediate rows, OLMoE's q/k norms
    over heads held by both ranks. fp32 sums in another order, same greedy tokens."""
    from batchgen import LLM, SamplingParams

    llm = LLM(tiny_models[arch], tensor_parallel=2, max_num_seqs=8)
    try:
        outputs = llm.generate_samples(moe_prompts[:8], SamplingParams(max_new_tokens=NEW_TOKENS))
    finally:
        llm.close()
    assert [o.token_ids for o in outputs] == moe_expected[arch][:8]
