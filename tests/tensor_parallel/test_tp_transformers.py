"""Tensor parallelism through transformers' own tp_plan, for architectures batchgen has no fused forward
for (a tiny Gemma): two gloo ranks produce what one process and transformers' ``generate`` produce, the
KV pool holds each rank's heads, and architectures with neither path (or heads that do not split) are
refused before any process starts.
"""

from __future__ import annotations

import pytest

import batchgen.llm
import batchgen.tensor_parallel.launch
from batchgen import LLM
from tests.engine.oracle import make_prompts, reference_greedy
from tests.tensor_parallel.tp_cases import ENGINE, GREEDY, SAMPLED, children, tokens_of

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def gemma(tiny_models) -> str:
    return tiny_models["gemma"]


@pytest.fixture(scope="module")
def gemma_prompts(gemma):
    from transformers import AutoTokenizer

    return make_prompts(AutoTokenizer.from_pretrained(gemma), count=6, max_tokens=80, seed=2)


def test_tp_plan_two_ranks_match_one_and_transformers(gemma, gemma_prompts):
    expected = reference_greedy(gemma, gemma_prompts, GREEDY.max_new_tokens)
    single = LLM(gemma, **ENGINE)
    assert tokens_of(single, gemma_prompts, GREEDY) == expected
    with LLM(gemma, tensor_parallel=2, **ENGINE) as split:
        assert split._rank.bundle.kv_shape.num_kv_heads == 1  # its half of the 2 KV heads
        assert tokens_of(split, gemma_prompts, GREEDY) == expected
        sampled = split.generate_samples(gemma_prompts, SAMPLED)
    reference = single.generate_samples(gemma_prompts, SAMPLED)
    assert [o.token_ids for o in sampled] == [o.token_ids for o in reference]
    for got, want in zip(sampled, reference, strict=True):
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-4)


def _refusal(path: str, size: int, monkeypatch: pytest.MonkeyPatch) -> str:
    """The refusal's message. The slow steps it must come before (starting the other ranks, building and
    loading this rank's model) are test doubles that record the call and stop there."""
    started: list[str] = []

    def slow(name: str):
        def step(*args, **kwargs):
            started.append(name)
            raise AssertionError(f"{name} ran before the refusal")

        return step

    monkeypatch.setattr(batchgen.tensor_parallel.launch, "start_workers", slow("start_workers"))
    monkeypatch.setattr(batchgen.llm, "build_rank", slow("build_rank"))
    before = children()
    with pytest.raises(ValueError) as info:
        LLM(path, tensor_parallel=size)
    assert started == [] and children() == before  # no rank started, no weights loaded
    return str(info.value)


def test_architecture_with_neither_path_is_refused_before_any_process_starts(tmp_path, monkeypatch):
    from transformers import AutoConfig, AutoTokenizer

    from tests.support.models import tokenizer_path

    config = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
    AutoConfig.for_model("stablelm", **config).save_pretrained(tmp_path)  # no tp_plan in transformers
    AutoTokenizer.from_pretrained(tokenizer_path()).save_pretrained(tmp_path)
    message = _refusal(str(tmp_path), 2, monkeypatch)
    assert message.startswith(
        "--tensor-parallel 2: model type 'stablelm' has neither batchgen's fused forward"
    )
    assert "nor a tensor-parallel plan in transformers" in message


def test_tp_plan_indivisible_heads_are_refused_before_any_process_starts(gemma, monkeypatch):
    message = _refusal(gemma, 3, monkeypatch)
    assert message == (
        "--tensor-parallel 3 does not divide the 4 attention heads and 2 key/value heads of model type "
        "'gemma' (transformers' tp_plan splits both evenly)"
    )
