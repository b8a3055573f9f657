"""``--data-parallel`` on a multi-GPU node: one GPU vs K workers on the same job, side by side.

Saves a random Qwen3-0.6B-shaped model (bf16) with the embedded model's tokenizer, writes N text
prompts, runs ``batchgen run`` on one GPU and then with ``--data-parallel K`` (wall time includes each
process's start and model load), and checks the merged output: every (index, sample) once, in input
order, all tokens generated. Greedy completions are compared too (bf16 batches of other sizes may flip
a near-tie, so the share of identical ones is reported, not asserted).

    PYTHONPATH=. python3 scripts/dp_check.py --workers 2 --rows 2048
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from batchgen.bench.workloads import build_random_model  # noqa: E402
from tests.support.models import tokenizer_path  # noqa: E402


def save_model(path: Path) -> None:
    from transformers import AutoTokenizer

    model = build_random_model("qwen3-0.6b", "cuda", torch.bfloat16)
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(tokenizer_path()).save_pretrained(path)
    del model
    torch.cuda.empty_cache()


def write_prompts(path: Path, rows: int) -> None:
    rng = random.Random(0)
    words = ["the", "a", "river", "stone", "light", "quick", "seven", "north", "garden", "paper", "winter"]
    with open(path, "wb") as f:
        for i in range(rows):
            text = " ".join(rng.choice(words) for _ in range(rng.randint(40, 120)))
            f.write(orjson.dumps({"id": f"r{i}", "prompt": text}) + b"\n")


def run(args: list[str], devices: str) -> float:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=devices, TOKENIZERS_PARALLELISM="false")
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "batchgen", "run", *args], env=env, capture_output=True, text=True
    )
    wall = time.perf_counter() - t0
    print(done.stderr[-3000:], flush=True)
    if done.returncode != 0:
        raise SystemExit(f"batchgen run {' '.join(args)} exited {done.returncode}")
    return wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=torch.cuda.device_count())
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    args = ap.parse_args()
    if args.workers < 2:
        print(f"dp_check: {torch.cuda.device_count()} GPU(s) visible, needs 2: skipped")
        return 0
    work = Path(tempfile.mkdtemp(prefix="dp-check-"))
    save_model(work / "model")
    write_prompts(work / "in.jsonl", args.rows)
    common = ["--model", str(work / "model"), "--max-new-tokens", str(args.max_new_tokens), "--ignore-eos",
              "--no-chat", "--log-every", "10"]  # fmt: skip
    one = run([str(work / "in.jsonl"), str(work / "one.jsonl"), *common], "0")
    devices = ",".join(map(str, range(args.workers)))
    many = run(
        [str(work / "in.jsonl"), str(work / "dp.jsonl"), *common, "--data-parallel", str(args.workers)],
        devices,
    )
    single = [orjson.loads(line) for line in (work / "one.jsonl").read_bytes().splitlines()]
    merged = [orjson.loads(line) for line in (work / "dp.jsonl").read_bytes().splitlines()]
    keys = [(r["index"], r["sample"]) for r in merged]
    assert keys == sorted(keys) == sorted((r["index"], r["sample"]) for r in single), "rows lost or repeated"
    assert all(r["completion_tokens"] == args.max_new_tokens for r in merged), "short completions"
    by_key = {(r["index"], r["sample"]): r["completion"] for r in single}
    same = sum(by_key[(r["index"], r["sample"])] == r["completion"] for r in merged) / len(merged)
    tokens = args.rows * args.max_new_tokens
    result = {
        "rows": args.rows, "new_tokens": args.max_new_tokens, "workers": args.workers,
        "one_gpu_wall_s": one, "data_parallel_wall_s": many, "speedup": one / many,
        "one_gpu_tok_s": tokens / one, "data_parallel_tok_s": tokens / many, "identical_completions": same,
    }  # fmt: skip
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
