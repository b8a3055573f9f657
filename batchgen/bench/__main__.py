"""``python -m batchgen.bench --workload B4``: the bench without the CLI (``make bench``, gpu_check.sh)."""

from __future__ import annotations

import argparse
import json
import os

from batchgen.bench.cli_entry import CommandOptions, run_bench
from batchgen.bench.workloads import WORKLOADS

MODES = ("async", "sync", "run", "generate_batch", "hf_loop", "hf_padded", "hf_forward")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m batchgen.bench", description=__doc__)
    ap.add_argument("--workload", action="append", choices=list(WORKLOADS), help="repeatable [B4]")
    ap.add_argument("--mode", action="append", choices=MODES, help="repeatable [async sync; B4: run]")
    ap.add_argument("--out", help="directory for bench.json and bench.md")
    ap.add_argument("--quick", action="store_true", help="shorter decodes, for smoke runs")
    ap.add_argument("--no-compare-hf", dest="compare_hf", action="store_false", help="skip the baselines")
    ap.add_argument("--device", help="override every workload's device (cuda, cpu, cuda:1)")
    ap.add_argument("--tensor-parallel", type=int, help="override every workload's GPU count (B5: 2)")
    ap.add_argument("--quantization", choices=["fp8"], help="batchgen's runs: FP8 projections")
    ap.add_argument(
        "--kv-cache-dtype", choices=["auto", "fp8"], default="auto", help="batchgen's runs [auto]"
    )
    ap.add_argument("--threads", type=int, help="B4: CPU threads of both commands [each its default]")
    ap.add_argument("--prompts", help="B4: a JSONL prompt file instead of the built-in mixed-length prompts")
    ap.add_argument("--repeat", type=int, default=1, help="B4: side-by-side rounds [1]")
    ap.add_argument(
        "--sampling", type=json.loads, help="batchgen's requests: more SamplingParams, '{\"min_p\": 0.1}'"
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = parse_args(argv)
    records = run_bench(
        workloads=args.workload or ["B4"],
        modes=args.mode or [],
        out_dir=args.out,
        quick=args.quick,
        compare_hf=args.compare_hf,
        device=args.device,
        tensor_parallel=args.tensor_parallel,
        quantization=args.quantization,
        kv_cache_dtype=args.kv_cache_dtype,
        opts=CommandOptions(args.threads, args.prompts, args.repeat),
        sampling=args.sampling,
    )
    return 1 if any(failed(r) for r in records) else 0


def failed(record: dict) -> bool:
    """A batchgen run that failed or lost tokens. A failing baseline is reported, not fatal: it is
    transformers' code, and the table already says why."""
    if record["mode"] not in ("async", "sync", "run", "-"):
        return False
    return bool(record.get("error")) or record.get("output_tokens") != record.get("expected_tokens")


if __name__ == "__main__":
    raise SystemExit(main())
