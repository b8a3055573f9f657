"""One decode step at a fixed context vs its roofline, batchgen's fused forward beside transformers'.

The step is what the engine replays: the decode CUDA graph of the batch's bucket (model forward,
paged attention, sampling), launched through the async runner on synthetic inputs (every sequence at
``--context`` tokens). GPU time per step comes from the runner's CUDA events; the roofline is the
bytes one step must move (weights + the KV it reads) over the bandwidth of a large device copy.

    PYTHONPATH=. python3 scripts/bench_step.py --preset B1 --out out/step.json
    PYTHONPATH=. python3 scripts/bench_step.py --preset B1 --quantization fp8 --kv-cache-dtype fp8

With FP8 the roofline counts the projections at one byte a weight and the cache at one byte an element.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from batchgen.bench import metrics  # noqa: E402
from batchgen.bench.workloads import build_random_model  # noqa: E402
from batchgen.engine.batch import StepInputs  # noqa: E402
from batchgen.llm import LLM  # noqa: E402
from batchgen.testing.models import tokenizer_path  # noqa: E402

PRESETS = {  # name -> (arch, batch, context): B1 at 4K context, B3 at its mean context
    "B1": ("llama3-8b", 32, 4096),
    "B3": ("qwen3-0.6b", 256, 640),
}


def decode_inputs(step_id: int, batch: int, context: int, block_size: int) -> StepInputs:
    """Every sequence decodes its token number ``context`` over its own run of blocks (greedy)."""
    per_seq = -(-context // block_size)
    tables = np.arange(batch * per_seq, dtype=np.int32).reshape(batch, per_seq)
    last = context - 1
    slots = tables[:, last // block_size].astype(np.int64) * block_size + last % block_size
    zeros = np.zeros(batch, np.int64)
    return StepInputs(
        step_id, zeros + 100, zeros - 1, zeros + last, slots, np.arange(batch + 1, dtype=np.int32),
        np.full(batch, context, np.int32), tables, np.arange(batch, dtype=np.int64),
        np.zeros(batch, np.float32), np.ones(batch, np.float32), zeros, zeros, zeros,
        False, False, 1, context,
    )  # fmt: skip


def time_steps(llm: LLM, batch: int, context: int, steps: int) -> dict:
    runner = llm._engine.runner
    block = llm.config.block_size
    handles = [runner.launch(decode_inputs(i, batch, context, block)) for i in range(2)]
    for h in handles:
        runner.fetch(h)  # warm-up
    busy0, t0 = runner.gpu_busy_s, time.perf_counter()
    prev = None
    for i in range(2, 2 + steps):  # the engine's pattern: launch step N, then fetch step N - 1
        handle = runner.launch(decode_inputs(i, batch, context, block))
        if prev is not None:
            runner.fetch(prev)
        prev = handle
    runner.fetch(prev)
    wall = time.perf_counter() - t0
    return {"gpu_ms": (runner.gpu_busy_s - busy0) / steps * 1e3, "wall_ms": wall / steps * 1e3}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", action="append", choices=list(PRESETS), help="repeatable [B1 B3]")
    ap.add_argument("--impl", action="append", choices=["batchgen", "transformers"])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--quantization", choices=["fp8"], help="batchgen's forward only")
    ap.add_argument(
        "--kv-cache-dtype", choices=["auto", "fp8"], default="auto", help="batchgen's forward only"
    )
    ap.add_argument("--out", help="write the results as JSON to this file")
    ap.add_argument("--json", action="store_true", help="also print the results as JSON")
    args = ap.parse_args()
    from transformers import AutoTokenizer

    device = torch.device("cuda")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path())
    bandwidth = metrics.measure_bandwidth(device)
    results = []
    for name in args.preset or ["B1", "B3"]:
        arch, batch, context = PRESETS[name]
        model = build_random_model(arch, "cuda", torch.bfloat16)
        for impl in args.impl or ["batchgen", "transformers"]:
            fp8 = (
                dict(quantization=args.quantization, kv_cache_dtype=args.kv_cache_dtype)
                if impl == "batchgen"
                else {}
            )
            sizes = metrics.model_bytes(model, **fp8)
            roofline_ms = (sizes["weights"] + batch * context * sizes["kv_per_token"]) / bandwidth * 1e3
            kv_bytes = int(batch * (context + 64) * sizes["kv_per_token"] * 1.05) + (64 << 20)
            llm = LLM.from_model(
                model, tokenizer, max_num_seqs=batch, max_model_len=context + 64, kv_cache_bytes=kv_bytes,
                model_impl=impl, extra={"progress": False}, **fp8,
            )  # fmt: skip
            r = time_steps(llm, batch, context, args.steps)
            r.update(preset=name, arch=arch, batch=batch, context=context, impl=impl,
                     roofline_ms=roofline_ms, bandwidth_gbs=bandwidth / 1e9, **fp8)  # fmt: skip
            r["vs_roofline"] = r["gpu_ms"] / roofline_ms
            tag = "".join(f" {k}={v}" for k, v in fp8.items() if v not in (None, "auto"))
            line = f"{name} {impl:12s}{tag} {batch} x {context}: GPU {r['gpu_ms']:.3f} ms/step, "
            line += (
                f"wall {r['wall_ms']:.3f} ms/step; roofline {roofline_ms:.3f} ms -> {r['vs_roofline']:.3f}x"
            )
            print(line, flush=True)
            results.append(r)
            del llm
            gc.collect()
            torch.cuda.empty_cache()
        del model
        gc.collect()
        torch.cuda.empty_cache()
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
