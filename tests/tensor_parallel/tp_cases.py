"""What the CPU tensor-parallel tests share: the engine options and sampling they run, the tokens a run
gives, and the worker processes this one has started."""

from __future__ import annotations

import os

from batchgen import LLM, SamplingParams

NEW_TOKENS = 10
GREEDY = SamplingParams(max_new_tokens=NEW_TOKENS)
SAMPLED = SamplingParams(
    max_new_tokens=NEW_TOKENS, temperature=0.9, top_p=0.8, top_k=40, seed=3, logprobs=True
)
# Small batches and chunks: queueing and chunked prefill happen under tensor parallelism too.
ENGINE = dict(max_num_seqs=4, max_batch_tokens=48)


def children() -> set[int]:
    pid = os.getpid()
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return {int(p) for p in f.read().split()}


def tokens_of(llm: LLM, prompts, params: SamplingParams) -> list[list[int]]:
    return [o.token_ids for o in llm.generate_samples(prompts, params)]
