"""Speculative decoding against plain decoding, side by side on one engine (docs/results.md, issue 45).

One LLM is built with ``--speculative ngram`` (or ``draft``); its plain runs detach the speculator, so both
kinds share the model, the KV cache and the graphs, and alternate (plain, speculative, plain, ...) to share
the machine's state. Workloads:
- ``rewrite``: B8, the embedded model (real weights) copying or lightly editing paragraphs
  (bench/rewrite.py), EOS on, ``--new-tokens`` at most;
- ``B1s``, ``B2``, ``B3``: the bench's random-weight workloads (guesses nearly always fail: what turning
  speculation on costs where it cannot help), ``--rows`` / ``--new-tokens`` to shorten them.
Each kind is also run with the policy forced on (``always``): the verify step's own cost. ``--draft PATH``
guesses with a draft model instead of prompt lookup; ``--draft random``: a 2-layer random Llama with the
workload's vocabulary and tokenizer (acceptance near zero: what a failed draft costs).

    python scripts/spec_bench.py --workload rewrite --rows 32 --out spec.json
    python scripts/spec_bench.py --workload rewrite --rows 32 --prompts 256   (a job streamed 32 rows wide)
    python scripts/spec_bench.py --workload B1s --draft random --out spec-draft.json
    python scripts/spec_bench.py --workload rewrite --rows 8 --new-tokens 128 --repeats 1   (the CPU)
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch

from batchgen import LLM, SamplingParams
from batchgen.bench.harness import prepare
from batchgen.bench.rewrite import rewrite_messages
from batchgen.bench.workloads import get_workload


def _engine(args: argparse.Namespace):
    """(llm, prompts, params) for the workload."""
    spec = dict(speculative="ngram", num_speculative_tokens=args.k, ngram_min=args.ngram_min)
    # every run computes its prompts: a run must not find the previous run's blocks in the prefix cache
    seqs = args.max_num_seqs or (args.rows if args.prompts else None)
    width = dict(prefix_caching=False, **({"max_num_seqs": seqs} if seqs else {}))
    if args.workload == "rewrite":
        if args.draft:
            spec = _draft_options(args, *_model_vocab(args.model))
        llm = LLM(args.model, **spec, **width)
        prompts = [llm.encode(m) for m in rewrite_messages(args.prompts or args.rows or 32, seed=0)]
        return llm, prompts, SamplingParams(max_new_tokens=args.new_tokens or 512)
    w = get_workload(args.workload)
    p = prepare(w, baselines=False)
    prompts = p.prompts[: args.prompts or args.rows or w.num_requests]
    if args.draft:
        spec = _draft_options(args, p.model.config.vocab_size, p.tokenizer.save_pretrained)
    llm = p.make_llm(**spec, **width)
    return llm, prompts, SamplingParams(max_new_tokens=args.new_tokens or w.max_new_tokens, ignore_eos=True)


def _model_vocab(model: str | None) -> tuple[int, Callable[[str], None]]:
    """A model directory's vocabulary size, and how to copy its tokenizer files into a directory."""
    from batchgen.config import EngineConfig
    from batchgen.model.loader import local_model_dir, open_checkpoint

    path = Path(local_model_dir(model))
    vocab = open_checkpoint(str(path), EngineConfig(model=model)).config.get_text_config().vocab_size
    files = [f for f in path.iterdir() if f.name.startswith(("tokenizer", "special_tokens"))]
    return vocab, lambda out: [shutil.copy(f, out) for f in files]


def _draft_options(args: argparse.Namespace, vocab: int, save_tokenizer: Callable[[str], None]) -> dict:
    path = args.draft if args.draft != "random" else _random_draft(vocab, save_tokenizer)
    return dict(speculative="draft", draft_model=path, num_speculative_tokens=args.k)


def _random_draft(vocab: int, save_tokenizer: Callable[[str], None]) -> str:
    """A 2-layer random Llama with the target's vocabulary and tokenizer, saved in a temporary directory."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=vocab, max_position_embeddings=16384, tie_word_embeddings=False,
    )  # fmt: skip
    path = tempfile.mkdtemp(prefix="random-draft-")
    AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(path)
    save_tokenizer(path)
    return path


def _timed(llm: LLM, prompts, params, kind: str, trace: StepTrace | None = None) -> dict:
    engine = llm._engine
    speculator = engine.speculator
    if kind == "plain":
        engine.speculator = None
    else:
        speculator.policy.adaptive = kind == "adaptive"
    before = dict(vars(llm.stats))
    _sync()
    if trace:
        trace.start()
    t0 = time.perf_counter()
    outs = llm.generate_samples(prompts, params)
    _sync()
    wall = time.perf_counter() - t0
    engine.speculator = speculator
    stats = vars(llm.stats)
    counted = ("steps", "verify_steps", "warm_verify_steps", "draft_tokens", "accepted_tokens", "void_rows",
               "overlapped_steps")  # fmt: skip
    delta = {k: stats[k] - before[k] for k in counted}
    tokens = sum(len(o.token_ids) for o in outs)
    busy = stats["gpu_busy_s"] - before["gpu_busy_s"]
    return {
        "kind": kind,
        "wall_s": round(wall, 3),
        "output_tokens": tokens,
        "longest_row": max(len(o.token_ids) for o in outs),  # a one-wave job lasts as long as it does
        "tok_per_s": round(tokens / wall, 1),
        "gpu_active_pct": round(100 * busy / wall, 1),
        "ms_per_step": round(1000 * wall / max(1, delta["steps"]), 3),
        "gpu_ms_per_step": round(1000 * busy / max(1, delta["steps"]), 3),
        "acceptance_rate": round(delta["accepted_tokens"] / max(1, delta["draft_tokens"]), 4),
        **delta,
        **({"trace": trace.summary()} if trace else {}),
    }


class TracedStep(NamedTuple):
    kind: int  # the policy's kind (0 plain, then policy.py's kinds)
    verify: bool  # it verified guesses
    warm: bool  # it ran a graph key eagerly or captured it
    prompts: bool  # it had new prompts (or their chunks)
    rows: int  # decoding rows
    seconds: float  # since the last step's tokens were taken


class StepTrace:
    """``--trace``: each step's interval between taking its tokens and the last step's, by kind of step:
    where a run's time goes."""

    def __init__(self, llm: LLM) -> None:
        engine, self.steps, self._last = llm._engine, [], 0.0
        postprocess = engine._postprocess

        def traced(step, handle):
            kind, warm = engine._speculated.get(step.step_id, 0), engine.runner.warming(handle)
            postprocess(step, handle)
            now = time.perf_counter()
            verify, prompts = step.decodes.drafts is not None, bool(step.items)
            self.steps.append(
                TracedStep(kind, verify, warm, prompts, len(step.decodes.requests), now - self._last)
            )
            self._last = now

        engine._postprocess = traced

    def start(self) -> None:
        self.steps, self._last = [], time.perf_counter()

    def summary(self, slowest: int = 12) -> dict:
        groups: dict[str, list[float]] = {}
        for s in self.steps:
            name = f"kind{s.kind}" + "-verify" * s.verify + "-warm" * s.warm + "-prompts" * s.prompts
            groups.setdefault(name, []).append(s.seconds)
        worst = sorted(range(len(self.steps)), key=lambda i: -self.steps[i].seconds)[:slowest]
        return {
            "by_group": {g: _spread(v) for g, v in sorted(groups.items())},
            "slowest": [[i, *self.steps[i][:5], _ms(self.steps[i].seconds)] for i in worst],
        }


def _spread(seconds: list[float]) -> dict:
    return {
        "steps": len(seconds),
        "s": round(sum(seconds), 3),
        "ms_median": _ms(sorted(seconds)[len(seconds) // 2]),
    }


def _ms(seconds: float) -> float:
    return round(1000 * seconds, 2)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="rewrite", choices=["rewrite", "B1s", "B2", "B3"])
    ap.add_argument("--model", help="rewrite: the model directory [the embedded model]")
    ap.add_argument("--rows", type=int)
    ap.add_argument(
        "--prompts", type=int, help="a job of this many prompts, --rows of them in flight [--rows: one wave]"
    )
    ap.add_argument("--new-tokens", type=int)
    ap.add_argument("--max-num-seqs", type=int)
    ap.add_argument("--k", type=int, default=4, help="--num-speculative-tokens")
    ap.add_argument("--draft", help="a draft model's directory, or 'random' (default: prompt lookup)")
    ap.add_argument("--ngram-min", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--trace", action="store_true", help="each run's time by kind of step, its slowest steps")
    ap.add_argument("--out")
    args = ap.parse_args()
    llm, prompts, params = _engine(args)
    trace = StepTrace(llm) if args.trace else None
    llm.generate_samples(prompts[:4], params.with_overrides(max_new_tokens=8))  # compiles, first graphs
    runs = []
    for _ in range(args.repeats):
        for kind in ("plain", "adaptive", "always"):
            runs.append(_timed(llm, prompts, params, kind, trace))
            print(json.dumps(runs[-1]), flush=True)
    best = {k: max(r["tok_per_s"] for r in runs if r["kind"] == k) for k in ("plain", "adaptive", "always")}
    summary = {
        "workload": args.workload,
        "method": "draft" if args.draft else "ngram",
        "prompts": len(prompts),
        "rows": args.rows if args.prompts else len(prompts),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "best_tok_per_s": best,
        "adaptive_vs_plain": round(best["adaptive"] / best["plain"], 3),
        "always_vs_plain": round(best["always"] / best["plain"], 3),
        "speculation_rates": llm.stats.speculation_rates,
        "runs": runs,
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=2)


if __name__ == "__main__":
    main()
