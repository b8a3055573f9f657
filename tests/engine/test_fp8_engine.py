"""FP8 through the engine: an e4m3 KV pool holds twice the blocks of a bf16 one in the same budget,
generation with FP8 weights and cache runs, transformers' forward refuses FP8, and tensor parallelism
over a block-quantized checkpoint (scales sliced with the weights) gives the single-process tokens."""

from __future__ import annotations

import math

import pytest
import torch

from batchgen import LLM, SamplingParams
from tests.engine.oracle import make_prompts

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _greedy(llm: LLM, prompts, new: int = 8) -> list[list[int]]:
    return [
        o.token_ids
        for o in llm.generate_samples(prompts, SamplingParams(max_new_tokens=new, ignore_eos=True))
    ]


def test_fp8_cache_holds_twice_the_blocks_and_generates(tiny_llama):
    from transformers import AutoTokenizer

    budget = dict(kv_cache_bytes=1 << 20, dtype="bfloat16")
    plain = LLM(tiny_llama, **budget)
    fp8 = LLM(tiny_llama, quantization="fp8", kv_cache_dtype="fp8", **budget)
    assert fp8.num_kv_blocks == 2 * plain.num_kv_blocks
    assert fp8._engine.runner.kv_caches[0][0].dtype == torch.float8_e4m3fn
    assert fp8._rank.bundle.forward.layers[0].mlp.down.weight.dtype == torch.float8_e4m3fn
    # Closeness to full precision is measured on logits (tests/model/test_fp8_checkpoints.py) and on the
    # real model (docs/results.md): a tiny random model's greedy tokens flip on small differences.
    prompts = make_prompts(AutoTokenizer.from_pretrained(tiny_llama), count=6, max_tokens=80, seed=1)
    outs = fp8.generate_samples(prompts, SamplingParams(max_new_tokens=8, ignore_eos=True, logprobs=True))
    assert all(len(o.token_ids) == 8 and o.finish_reason == "length" for o in outs)
    assert all(torch.isfinite(torch.tensor(o.logprobs)).all() for o in outs)


def test_transformers_forward_refuses_fp8(tiny_llama):
    for options in (dict(quantization="fp8"), dict(kv_cache_dtype="fp8")):
        with pytest.raises(ValueError, match="need batchgen's own forward"):
            LLM(tiny_llama, model_impl="transformers", **options)


def test_tensor_parallel_block_fp8_checkpoint_matches_one_process(tmp_path):
    """TP=2 on the CPU (gloo): q rows split on a block boundary, k/v rows (64) inside one (per-row scales),
    o_proj / down_proj input columns split at 128; an FP8 KV cache on both."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from tests.support.fp8 import write_checkpoint
    from tests.support.models import tokenizer_path

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path())
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=512,
        tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    prompts = make_prompts(tokenizer, count=4, max_tokens=24, seed=2)
    write_checkpoint(model, tmp_path, "fp8-block", torch.tensor(prompts[0]))
    tokenizer.save_pretrained(tmp_path)
    options = dict(kv_cache_dtype="fp8", device="cpu", max_model_len=64)
    want = _greedy(LLM(str(tmp_path), **options), prompts)
    with LLM(str(tmp_path), tensor_parallel=2, **options) as llm:
        got = _greedy(llm, prompts)
    assert got == want


def _first_split(a, b) -> str | None:
    """Why two greedy runs of one FP8 model may part (None: they may not). Graph and eager launches run
    the GEMMs at other row counts (graph buckets pad the batch), so cuBLASLt may sum in another order;
    a 1-ulp bf16 difference moves an activation across an e4m3 rounding boundary (a 6 % step), so FP8
    runs may break exact ties the other way. Either token can win only if both runs gave their pick at
    most about half the probability (p_a + p_b <= 1 in both); the lm_head is scaled 8x, so a real error
    flips tokens picked at p ~ 1. Before the split, both runs' log-probabilities must agree."""
    j = next((k for k, (x, y) in enumerate(zip(a.token_ids, b.token_ids, strict=True)) if x != y), None)
    before = max((abs(x - y) for x, y in zip(a.logprobs[:j], b.logprobs[:j], strict=False)), default=0.0)
    assert before < 0.1, f"log-probabilities differ by {before:.3f} before any token does"
    if j is None:
        return None
    p_a, p_b = math.exp(a.logprobs[j]), math.exp(b.logprobs[j])
    return f"token {j}: p {p_a:.2f} vs {p_b:.2f}" if max(p_a, p_b) < 0.6 else None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_fp8_engine_graphs_equal_eager(tiny_llama):
    """FP8 weights and cache on CUDA: decode graphs replay what eager steps compute: the same tokens, or a
    split at an FP8 near-tie (``_first_split``) in at most 2 of the 12 prompts."""
    from transformers import AutoTokenizer

    prompts = make_prompts(AutoTokenizer.from_pretrained(tiny_llama), count=12, max_tokens=200, seed=4)
    options = dict(dtype="bfloat16", quantization="fp8", kv_cache_dtype="fp8", max_num_seqs=8)
    params = SamplingParams(max_new_tokens=24, ignore_eos=True, logprobs=True)
    graphs = LLM(tiny_llama, cuda_graphs=True, **options).generate_samples(prompts, params)
    eager = LLM(tiny_llama, cuda_graphs=False, async_mode=False, **options).generate_samples(prompts, params)
    splits = {}
    for i, (g, e) in enumerate(zip(graphs, eager, strict=True)):
        why = _first_split(g, e)  # checks the log-probabilities of every prompt
        if g.token_ids != e.token_ids:
            splits[i] = why
    bad = [i for i, why in splits.items() if why is None]
    assert not bad and len(splits) <= 2, f"prompts {bad} differ at decisive tokens (near-ties: {splits})"
