"""Tensor parallelism on the CPU (gloo): K processes produce what one process produces, and what
transformers' own ``generate`` produces, token for token; sampling is the same; bad splits are refused
before any process starts.

Each ``LLM(tensor_parallel=K)`` starts K - 1 worker processes (a few seconds of imports each), so every
model is started once per module and reused.
"""

from __future__ import annotations

import pytest

from batchgen import LLM
from tests.engine.oracle import make_prompts, reference_greedy
from tests.tensor_parallel.tp_cases import ENGINE, GREEDY, NEW_TOKENS, SAMPLED, children, tokens_of

# Every per-row device statistic, and prompt log-probabilities (gathered over the vocabulary's shares).
EVERYTHING = SAMPLED.with_overrides(
    min_p=0.05,
    repetition_penalty=1.2,
    frequency_penalty=0.3,
    logit_bias={"5": 3.0},
    min_tokens=2,
    logprobs=3,
    prompt_logprobs=2,
)
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tiny_prompts(tiny_llama):
    from transformers import AutoTokenizer

    return make_prompts(AutoTokenizer.from_pretrained(tiny_llama), count=10, max_tokens=120)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_two_ranks_match_one_and_transformers(tiny_models, tiny_prompts, arch):
    path = tiny_models[arch]
    expected = reference_greedy(path, tiny_prompts, NEW_TOKENS)
    assert max(map(len, tiny_prompts)) > ENGINE["max_batch_tokens"]  # so some prefills run in chunks
    single = LLM(path, **ENGINE)
    with LLM(path, tensor_parallel=2, **ENGINE) as split:
        assert tokens_of(split, tiny_prompts, GREEDY) == expected
        sampled = split.generate_samples(tiny_prompts, SAMPLED)
        everything = split.generate_samples(tiny_prompts, EVERYTHING)
    reference = single.generate_samples(tiny_prompts, SAMPLED)
    assert [o.token_ids for o in sampled] == [o.token_ids for o in reference]
    for got, want in zip(sampled, reference, strict=True):
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-4)
    for got, want in zip(everything, single.generate_samples(tiny_prompts, EVERYTHING), strict=True):
        assert got.token_ids == want.token_ids
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-4)
        assert got.prompt_logprobs[1:] == pytest.approx(want.prompt_logprobs[1:], abs=1e-4)
        assert [[t for t, _ in top] for top in got.top_logprobs] == [
            [t for t, _ in top] for top in want.top_logprobs
        ]


def test_embedded_model_over_three_ranks(default_model_path):
    """9 query heads and 3 KV heads: one KV head per rank; the vocabulary split three ways."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(default_model_path)
    prompts = make_prompts(tokenizer, count=6, max_tokens=80, seed=5)
    expected = reference_greedy(default_model_path, prompts, NEW_TOKENS)
    with LLM(tensor_parallel=3, **ENGINE) as split:
        assert tokens_of(split, prompts, GREEDY) == expected


def test_indivisible_head_count_is_refused_before_any_process_starts(tiny_llama):
    before = children()
    with pytest.raises(ValueError, match="--tensor-parallel 3 does not divide the model's 4 attention heads"):
        LLM(tiny_llama, tensor_parallel=3)
    assert children() == before


def test_structured_output_over_two_ranks_matches_one(tiny_llama, tiny_prompts):
    """Token masks reach every rank with the sampling order (the asynchronous loop: a step's masks are
    filled after the next step was launched)."""
    number = {"type": "integer", "minimum": 0, "maximum": 99}
    schema = {"type": "object", "properties": {"n": number}, "required": ["n"]}
    kinds = [dict(json_schema=schema), dict(choices=["yes", "no"]), dict(regex="[a-c]{1,6}"), {}]
    params = [
        (SAMPLED if i % 3 else GREEDY).with_overrides(max_new_tokens=24, **kinds[i % 4])
        for i in range(len(tiny_prompts))
    ]
    reference = LLM(tiny_llama, async_mode=True, **ENGINE).generate_samples(tiny_prompts, params)
    with LLM(tiny_llama, tensor_parallel=2, async_mode=True, **ENGINE) as split:
        outs = split.generate_samples(tiny_prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in reference]
    assert all(o.finish_reason == "stop" for o, p in zip(outs, params, strict=True) if p.constrained)
