"""Tensor parallelism on two GPUs (NCCL, all-reduces captured in the decode graphs): fp32 tokens equal
transformers' generate and the one-GPU engine's, greedy and sampled, in every runner mode."""

from __future__ import annotations

import pytest
import torch

from batchgen import LLM, GenerationRequest, SamplingParams
from batchgen.model.kv_cache import kv_shape
from tests.engine.oracle import make_prompts, reference_greedy

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs"),
]

GREEDY = SamplingParams(max_new_tokens=24)
SAMPLED = SamplingParams(max_new_tokens=24, temperature=0.8, top_p=0.9, top_k=50, seed=3, ignore_eos=True)
MODES = {"async_graphs": dict(async_mode=True), "sync_eager": dict(async_mode=False, cuda_graphs=False)}


def _outputs(llm: LLM, prompts, params) -> list[list[int]]:
    outs = llm.stream([GenerationRequest(i, p, params) for i, p in enumerate(prompts)])
    return [o.token_ids for o in sorted(outs, key=lambda o: o.index)]


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_two_gpus_match_transformers_and_one_gpu(tiny_models, arch):
    from transformers import AutoConfig, AutoTokenizer

    path = tiny_models[arch]
    prompts = make_prompts(AutoTokenizer.from_pretrained(path), count=24, max_tokens=300)
    expected = reference_greedy(path, prompts, GREEDY.max_new_tokens, device="cuda")
    kv_bytes = kv_shape(AutoConfig.from_pretrained(path)).bytes_per_block(450, torch.float32)
    # Small budgets: chunked prefill and preemption; the KV pool is per rank (half the heads each).
    options = dict(dtype="float32", max_num_seqs=8, max_batch_tokens=128, kv_cache_bytes=kv_bytes // 2)
    with LLM(path, **{**options, "kv_cache_bytes": kv_bytes}) as one:
        sampled_one = _outputs(one, prompts, SAMPLED)
    for name, mode in MODES.items():
        with LLM(path, tensor_parallel=2, **options, **mode) as two:
            assert _outputs(two, prompts, GREEDY) == expected, name
            assert _outputs(two, prompts, SAMPLED) == sampled_one, name
            assert two.stats.preemptions > 0, f"{name}: the small KV pool should force preemption"
            ranks = two.rank_stats()
            assert all(r["gpu_busy_s"] > 0 for r in ranks), ranks
