"""Where the host's time goes in a whole ``batchgen run``: a sampling profiler of every Python thread.

    python scripts/sample_stacks.py [--b7 DIR] [--interval-ms 1] [--top 25] -- RUN_ARGS...

Runs ``batchgen run RUN_ARGS`` in this process while a thread takes a snapshot of every thread's stack
each interval (``sys._current_frames``), then prints, per thread, the innermost frames it was found in
(self time) and the functions on its stack (inclusive time) as shares of its samples. A thread blocked in
a C call (a CUDA event wait, a GIL hand-off after a torch op) is found at the Python line that made the
call, so waiting shows up where it happens. ``--b7 DIR`` writes B7's inputs (8192 chat prompts, the
embedded model or random weights of its shape on a GPU machine without it) to DIR and prepends them to
RUN_ARGS as B7 runs them.
"""

from __future__ import annotations

import argparse
import collections
import sys
import threading
import time
from pathlib import Path

Counts = collections.Counter


def _label(frame) -> str:
    code = frame.f_code
    path = code.co_filename
    short = path.split("batchgen/", 1)[-1] if "batchgen/" in path else Path(path).name
    return f"{short}:{code.co_name}:{frame.f_lineno}"


def _functions(frame) -> set[str]:
    names = set()
    while frame is not None:
        code = frame.f_code
        names.add(f"{Path(code.co_filename).name}:{code.co_name}")
        frame = frame.f_back
    return names


class Sampler(threading.Thread):
    def __init__(self, interval: float) -> None:
        super().__init__(name="stack-sampler", daemon=True)
        self.interval, self.stop = interval, threading.Event()
        self.leaves: dict[str, Counts] = collections.defaultdict(Counts)
        self.inclusive: dict[str, Counts] = collections.defaultdict(Counts)
        self.samples: Counts = Counts()

    def run(self) -> None:
        me = threading.get_ident()
        while not self.stop.wait(self.interval):
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                name = names.get(ident, str(ident))
                self.samples[name] += 1
                self.leaves[name][_label(frame)] += 1
                self.inclusive[name].update(_functions(frame))

    def report(self, top: int) -> str:
        lines = []
        for name, n in self.samples.most_common():
            lines.append(f"\n== thread {name}: {n} samples ==")
            views = (("self (innermost line)", self.leaves[name]), ("inclusive", self.inclusive[name]))
            for title, counts in views:
                lines.append(f"-- {title}")
                lines += [f"{100 * c / n:6.1f}%  {label}" for label, c in counts.most_common(top)]
        return "\n".join(lines)


def b7_args(workdir: Path) -> list[str]:
    from batchgen.bench import commands
    from batchgen.bench.workloads import chat_prompts

    workdir.mkdir(parents=True, exist_ok=True)
    prompts = commands.write_prompts(chat_prompts(8192), workdir / "prompts.jsonl")
    args = [str(prompts), str(workdir / "out.jsonl"), "--max-new-tokens", "256", "--ignore-eos"]
    args += ["--no-progress", "--overwrite", "--stats-file", str(workdir / "stats.json")]
    if not commands.embedded_model_installed():
        args += ["--model", str(commands.random_embedded_model(workdir / "model"))]
    return args


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--b7", type=Path, help="write B7's inputs here and run them")
    ap.add_argument("--interval-ms", type=float, default=1.0)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--out", type=Path, help="also write the report here")
    ap.add_argument("--no-sample", action="store_true", help="run without the sampler (an A/B baseline)")
    ap.add_argument("--switch-interval-ms", type=float, help="the interpreter's GIL switch interval")
    ap.add_argument("run_args", nargs="*")
    args = ap.parse_args()
    run_args = (b7_args(args.b7) if args.b7 else []) + args.run_args
    from batchgen.cli import main as batchgen_main

    if args.switch_interval_ms:
        sys.setswitchinterval(args.switch_interval_ms / 1000)
    sampler = Sampler(args.interval_ms / 1000)
    if not args.no_sample:
        sampler.start()
    t0 = time.perf_counter()
    try:
        batchgen_main(["run", *run_args])
    except SystemExit as e:
        print(f"batchgen run exited {e.code}", file=sys.stderr)
    sampler.stop.set()
    if not args.no_sample:
        sampler.join()
    text = f"wall {time.perf_counter() - t0:.1f} s" + sampler.report(args.top)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
