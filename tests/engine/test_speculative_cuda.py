"""On a GPU: speculative decoding through the CUDA runner (verify steps beside graph-replayed decode steps,
the asynchronous loop, where verify steps chain) gives plain decoding's output, greedy and sampled, token
for token in float32; in bfloat16, where a verify step's matrix products may round differently from a
decode step's, the outputs are compared and the share that agrees is reported."""

from __future__ import annotations

import pytest
import torch

from batchgen import LLM, SamplingParams
from tests.engine.speculative_cases import SPECULATE, copying_prompts

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

GREEDY = SamplingParams(max_new_tokens=48, ignore_eos=True)
SAMPLED = SamplingParams(max_new_tokens=48, temperature=0.8, top_p=0.9, seed=3, ignore_eos=True)


def _outs(llm: LLM, prompts, params) -> list[list[int]]:
    return [o.token_ids for o in llm.generate_samples(prompts, params)]


@pytest.mark.parametrize("async_mode", [True, False])
def test_cuda_verify_steps_give_plain_output_in_fp32(tiny_llama, async_mode):
    prompts = copying_prompts(32, seed=3)
    options = dict(dtype="float32", max_num_seqs=16, async_mode=async_mode)
    plain = LLM(tiny_llama, **options)
    want = (_outs(plain, prompts, GREEDY), _outs(plain, prompts, SAMPLED))
    del plain
    llm = LLM(tiny_llama, **options, **SPECULATE)
    assert (_outs(llm, prompts, GREEDY), _outs(llm, prompts, SAMPLED)) == want
    stats = llm.stats
    assert stats.verify_steps > 0 and stats.accepted_tokens > 0
    # each verify graph's first uses run eagerly, then it is captured
    assert 0 < stats.warm_verify_steps <= stats.verify_steps
    if async_mode:  # verify steps chained: launched behind another, some rows voided by a rejection
        assert stats.overlapped_steps > stats.verify_steps // 2 and stats.void_rows > 0, stats


@pytest.mark.parametrize("draft_arch", ["llama", "qwen2"])
def test_cuda_draft_model_gives_plain_output_in_fp32(tiny_models, draft_arch):
    """A draft model's forwards on the GPU beside the target's graphs: the target itself as the draft
    (guesses accepted) and a random one (rejected)."""
    prompts = copying_prompts(32, seed=5)
    options = dict(dtype="float32", max_num_seqs=16)
    plain = LLM(tiny_models["llama"], **options)
    want = (_outs(plain, prompts, GREEDY), _outs(plain, prompts, SAMPLED))
    del plain
    llm = LLM(tiny_models["llama"], **options, speculative="draft", draft_model=tiny_models[draft_arch],
              speculative_policy="always")  # fmt: skip
    greedy = _outs(llm, prompts, GREEDY)
    accepted, guessed = llm.stats.accepted_tokens, llm.stats.draft_tokens
    assert (greedy, _outs(llm, prompts, SAMPLED)) == want
    assert llm.stats.verify_steps > 0 and guessed > 0
    if draft_arch == "llama":  # greedy: the draft's argmax is the target's own
        assert accepted > 0.9 * guessed, (accepted, guessed)


def test_cuda_bf16_agreement_is_reported(tiny_llama):
    prompts = copying_prompts(32, seed=4)
    want = _outs(LLM(tiny_llama, max_num_seqs=16), prompts, GREEDY)
    llm = LLM(tiny_llama, max_num_seqs=16, **SPECULATE)
    got = _outs(llm, prompts, GREEDY)
    same = sum(g == w for g, w in zip(got, want, strict=True))
    print(f"bf16: {same} of {len(prompts)} greedy outputs identical with speculation")
    assert llm.stats.verify_steps > 0
    # a difference must start where two tokens were near-tied, never as a broken row: each output has
    # its full length and starts the same
    assert all(len(g) == len(w) and g[:1] == w[:1] for g, w in zip(got, want, strict=True))
