"""Start-up side by side (issue 15): ``batchgen run`` on a short input, rounds interleaved between
variants that differ only in their environment, beside the bare import floors of this machine. Prints the
median of each start-up phase (the stats file's ``startup``) per variant.

    PYTHONPATH=. python3 scripts/startup_ab.py [--rounds 3] [--prompts 256] [--model DIR]

Variants: ``lean`` (the default: the checkpoint's config, tokenizer and generation config read from its
files, ``batchgen/model/files/``; packages transformers would import only because they are installed stay
hidden, ``batchgen/lean_imports.py``), ``transformers`` (BATCHGEN_READ_WITH_TRANSFORMERS=1: all three
read through transformers, as before) and ``import_all`` (that, and BATCHGEN_IMPORT_ALL=1).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from batchgen.bench.whole_commands import startup_inputs

_TRANSFORMERS = {"BATCHGEN_READ_WITH_TRANSFORMERS": "1"}
VARIANTS = {
    "lean": {},
    "transformers": _TRANSFORMERS,
    "import_all": _TRANSFORMERS | {"BATCHGEN_IMPORT_ALL": "1"},
}
FLOORS = {
    "python": "pass",
    "import torch": "import torch",
    "torch + cuda init": "import torch; torch.zeros(1, device='cuda')",
    "transformers AutoConfig": "from transformers import AutoConfig",
}


def _env(extra: dict[str, str]) -> dict[str, str]:
    path = os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH", "")) if p)
    return os.environ | {"PYTHONPATH": path} | extra


def _seconds(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def _run_once(tmp: Path, prompts: Path, model: str | None, extra: dict[str, str], i: int) -> dict:
    stats = tmp / f"stats-{i}.json"
    argv = [sys.executable, "-m", "batchgen", "run", str(prompts), str(tmp / f"out-{i}.jsonl"),
            "--max-new-tokens", "8", "--ignore-eos", "--stats-file", str(stats)]  # fmt: skip
    argv += ["--model", model] if model else []
    wall = _seconds(argv, _env(extra))
    return json.loads(stats.read_text())["startup"] | {"wall_s": round(wall, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--model", default=None)
    ap.add_argument("--arch", default=None, help="a random checkpoint of this shape (bench ARCHS: llama3-8b)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="startup-ab-"))
    model, prompts = startup_inputs(tmp, args.model, args.prompts, args.arch)
    _run_once(tmp, prompts, model, {}, -1)  # untimed: compiles and caches what the first run would
    for name, code in FLOORS.items():
        try:
            times = [_seconds([sys.executable, "-c", code], _env({})) for _ in range(args.rounds)]
        except subprocess.CalledProcessError:  # e.g. no CUDA on this machine
            print(f"floor {name:24s} unavailable here")
            continue
        each = ", ".join(f"{t:.2f}" for t in times)
        print(f"floor {name:24s} median {statistics.median(times):6.2f} s  ({each})")
    runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for r in range(args.rounds):
        for v, (name, extra) in enumerate(VARIANTS.items()):
            runs[name].append(_run_once(tmp, prompts, model, extra, r * len(VARIANTS) + v))
    keys = list(runs["lean"][0])
    print("phase".ljust(20) + "".join(f"{v:>14s}" for v in VARIANTS))
    for key in keys:
        medians = [statistics.median(run.get(key, 0.0) for run in runs[v]) for v in VARIANTS]
        print(key.ljust(20) + "".join(f"{m:14.2f}" for m in medians))
    print(json.dumps(runs))


if __name__ == "__main__":
    main()
