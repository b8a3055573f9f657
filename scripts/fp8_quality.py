"""What FP8 costs in quality on the embedded model (SmolLM2-135M-Instruct): greedy agreement and log-probs.

For each configuration (FP8 weights; FP8 weights + FP8 KV cache; FP8 KV cache alone) beside the
unquantized model:
- the share of a varied prompt set whose first ``--tokens`` greedy tokens equal the unquantized model's;
- the mean difference of log-probabilities of a fixed text's tokens (teacher-forced, in one prefill through
  the paged cache), and the mean absolute difference.

    PYTHONPATH=. python3 scripts/fp8_quality.py [--device cuda] [--out quality.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from batchgen import LLM, SamplingParams  # noqa: E402
from batchgen.model.kv_cache import cache_dtype  # noqa: E402
from batchgen.testing.paged import sequence_logits  # noqa: E402

PROMPTS = [
    "What is the capital of France?", "Write a haiku about autumn leaves.", "Explain recursion to a child.",
    "List three uses of a paperclip.", "Translate 'good morning' into Spanish.", "Why is the sky blue?",
    "Summarise the water cycle in one sentence.", "Name two prime numbers greater than fifty.",
    "Describe a cat in five words.", "What does a compiler do?", "Suggest a name for a bakery.",
    "How many legs does a spider have?", "Write a limerick about a robot.", "What is photosynthesis?",
    "Explain what a linked list is.", "Give a tip for learning a new language.", "What is 17 times 3?",
    "Write a Python function that reverses a string.", "Who wrote Romeo and Juliet?",
    "What causes earthquakes?", "Give me a recipe for pancakes.", "What is the boiling point of water?",
    "Tell me a joke about computers.", "How do vaccines work?", "Write the opening line of a mystery novel.",
    "What are the primary colours?", "Explain the difference between weather and climate.",
    "Convert 5 kilometres to miles.", "What is a black hole?", "Write a short poem about the sea.",
    "How do I make a cup of green tea?", "What is the largest planet in our solar system?",
    "Give three synonyms for happy.", "Explain how a bicycle stays upright.", "What is machine learning?",
    "Describe the taste of a lemon.", "Write an email asking for a day off.", "What is the speed of light?",
    "Why do leaves change colour in autumn?", "Name a famous painting by Leonardo da Vinci.",
    "What is the square root of 144?", "How does a refrigerator keep food cold?",
    "Write a two-sentence horror story.", "What language is spoken in Brazil?",
    "Explain what an API is to a beginner.", "What should I pack for a beach holiday?",
    "How many continents are there?", "Write a motivational quote.",
]  # fmt: skip
TEXT = (
    "The history of the bicycle begins in the early nineteenth century, when inventors in Europe built "
    "wooden machines that riders pushed along with their feet. Pedals attached to the front wheel came "
    "decades later, and the safety bicycle, with two wheels of equal size and a chain driving the rear "
    "wheel, made cycling popular in the 1880s. Pneumatic tyres followed soon after, and within a few years "
    "millions of people used bicycles to travel to work, to explore the countryside and to race. Today the "
    "bicycle remains one of the most efficient ways to turn human energy into motion."
)
CONFIGS = {
    "fp8 weights": dict(quantization="fp8"),
    "fp8 weights + fp8 KV": dict(quantization="fp8", kv_cache_dtype="fp8"),
    "fp8 KV": dict(kv_cache_dtype="fp8"),
}


def greedy(llm: LLM, tokens: int) -> list[list[int]]:
    params = SamplingParams(max_new_tokens=tokens, ignore_eos=True)
    return [o.token_ids for o in llm.generate_samples(PROMPTS, params)]


def text_logprobs(llm: LLM, ids: torch.Tensor) -> torch.Tensor:
    """log p(ids[t] | ids[:t]) for t >= 1, teacher-forced in one prefill chunk (attention reads the cache)."""
    rank = llm._rank
    dtype = cache_dtype(llm.config.kv_cache_dtype, rank.dtype)
    backend = rank.runner.backend
    with torch.inference_mode():
        logits = sequence_logits(rank.bundle.forward, ids, [len(ids)], rank.bundle.kv_shape, dtype, backend)
    logp = torch.log_softmax(logits.float(), dim=-1)[:-1]
    return logp.gather(1, ids[1:, None]).squeeze(1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None, help="[bf16 on CUDA, fp32 on CPU]")
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--out")
    args = ap.parse_args()
    base_opts = dict(device=args.device, dtype=args.dtype, cuda_graphs=False, extra={"progress": False})
    base = LLM(**base_opts)
    ids = torch.tensor(base.tokenizer.encode(TEXT), device=base.device)
    want, want_lp = greedy(base, args.tokens), text_logprobs(base, ids)
    results = {"prompts": len(PROMPTS), "tokens": args.tokens, "text_tokens": len(ids) - 1,
               "device": str(base.device), "dtype": str(base.dtype)}  # fmt: skip
    del base
    for name, opts in CONFIGS.items():
        llm = LLM(**base_opts, **opts)
        got, lp = greedy(llm, args.tokens), text_logprobs(llm, ids)
        same = sum(a[: args.tokens] == b[: args.tokens] for a, b in zip(want, got, strict=True))
        diff = lp - want_lp
        results[name] = {
            "same_first_tokens": same / len(PROMPTS),
            "mean_logprob_diff": float(diff.mean()),
            "mean_abs_logprob_diff": float(diff.abs().mean()),
        }
        share = f"{same}/{len(PROMPTS)} ({100 * same / len(PROMPTS):.1f} %)"
        print(f"{name:22s} first {args.tokens} tokens equal: {share}; log-prob diff mean {diff.mean():+.4f}, "
              f"mean |diff| {diff.abs().mean():.4f}", flush=True)  # fmt: skip
        del llm
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
