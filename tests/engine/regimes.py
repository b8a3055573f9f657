"""The scheduling regimes the oracle tests run batchgen under, and the check that its greedy output under
one of them equals the oracle's (tests/engine/oracle.py)."""

from __future__ import annotations

from batchgen import LLM, SamplingParams
from batchgen.model.forward import TransformersForward
from batchgen.model.fused import FusedForward

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


def tiny_kv_bytes(llm_probe: LLM, tokens: int) -> int:
    per_block = (
        llm_probe._engine.runner.kv_caches[0][0][0].numel() * 4 * 2 * len(llm_probe._engine.runner.kv_caches)
    )
    return per_block * (-(-tokens // llm_probe.config.block_size))


def greedy_run(path: str, prompts, **options) -> tuple[list[list[int]], LLM]:
    llm = LLM(path, **options)
    outputs = llm.generate_samples(prompts, GREEDY)
    assert [o.index for o in outputs] == list(range(len(prompts)))
    return [o.token_ids for o in outputs], llm


def check_model(path: str, prompts: list[list[int]], regime: str, expected: list[list[int]]) -> None:
    options = dict(REGIMES[regime])
    if regime == "tiny_kv":
        probe = LLM(path, kv_cache_bytes=1 << 20)
        longest = max(len(p) for p in prompts) + NEW_TOKENS
        options["kv_cache_bytes"] = tiny_kv_bytes(probe, int(longest * 1.15))
    got, llm = greedy_run(path, prompts, **options)
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
