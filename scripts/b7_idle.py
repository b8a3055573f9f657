"""Where B7's GPU waits: ``batchgen run`` in this process on a CUDA machine, instrumented (issue 12).

    python scripts/b7_idle.py OUTDIR [--rows 8192] [--staggered] [--model DIR] [--package-root DIR]
                                     [--profile-eager N ...]

Runs B7's command (the embedded model's shape with random bf16 weights, chat prompts x 256 new tokens,
EOS ignored) and prints, beside the stats file's throughput and GPU-active share:
- the compute stream's idle time before each step, split into the first four steps of each wave of
  256 rows (``b0``: the wave's prefill, ``b1``-``b3``: its first decodes) and the rest, with the count
  of pauses over 1 ms outside those;
- when the command reached its phases (threads started, engine loop entered and left), from the moment
  the run's clock starts (``Progress``);
- the steps with new prompts (eager, or replayed from a token bucket's graph): host time of their launch
  and their compute-stream busy time;
- for two waves, the engine thread's phases around the boundary (``_launch_next``, ``_pull``,
  ``_postprocess``, the scheduler's ``_admit``) beside the idle gaps.

``--staggered`` runs B7s instead (each row its own length, 16-496 tokens: rows end at different steps);
``--profile-eager 0 5`` writes a cProfile of the first and the sixth eager launch to OUTDIR (Python 3.12's
cProfile sees every thread). ``--package-root`` imports batchgen from another checkout (e.g. ``git
archive`` of an older commit), so an A/B runs both sides with this same instrumentation; the wrappers
touch private names, which this script's versions must share. Interleave the sides and warm Triton's
cache with a short run first.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import sys
import time
from pathlib import Path

MARKS: list[tuple[str, float]] = []
PHASES: list[tuple[str, float, float]] = []
GAPS: list[tuple[int, float]] = []  # (step, idle ms before it)
EAGER: dict[int, list] = {}  # step with new prompts -> [host launch ms, tokens, busy ms, replayed a graph]
PROFILE: dict[int, Path] = {}  # eager launch number (0 = the first) -> where its cProfile goes


def _inputs(rows: int, model: Path | None, staggered: bool) -> tuple[Path, Path]:
    """The prompt file and model, made once and shared by both sides of an A/B (an older checkout may
    lack what makes them: the new side runs first)."""
    prompts = Path(f"/tmp/b7_idle_{rows}{'_staggered' if staggered else ''}.jsonl")
    if not prompts.exists():  # staggered: B7s, rows of 16-496 new tokens, ending at different steps
        from batchgen.bench.whole_commands import write_prompts
        from batchgen.bench.workloads import chat_prompts, staggered_lengths

        write_prompts(chat_prompts(rows), prompts, staggered_lengths(rows) if staggered else None)
    model = model or Path("/tmp/b7_idle_model")
    if not model.exists():
        from batchgen.bench.whole_commands import random_embedded_model

        random_embedded_model(model)
    return prompts, model


def _timed(cls, name: str) -> None:
    inner = getattr(cls, name)

    def wrapper(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return inner(self, *args, **kwargs)
        finally:
            PHASES.append((name, t0, time.perf_counter()))

    setattr(cls, name, wrapper)


def _marked(cls, name: str) -> None:
    inner = getattr(cls, name)

    def wrapper(self, *args, **kwargs):
        MARKS.append((name + ">", time.perf_counter()))
        try:
            return inner(self, *args, **kwargs)
        finally:
            MARKS.append((name + "<", time.perf_counter()))

    setattr(cls, name, wrapper)


def _instrument() -> None:
    import batchgen.app.progress as progress
    import batchgen.app.run as run
    import batchgen.engine.cuda_runner as cuda_runner
    import batchgen.engine.engine as engine
    import batchgen.engine.idle_gaps as idle_gaps
    import batchgen.engine.scheduler as scheduler

    for cls, name in [(engine.Engine, "_postprocess"), (engine.Engine, "_pull"),
                      (engine.Engine, "_launch_next"), (scheduler.Scheduler, "_admit")]:  # fmt: skip
        _timed(cls, name)
    job = next(c for c in vars(run).values() if isinstance(c, type) and hasattr(c, "_drive"))
    for name in ("_start_threads", "_drive"):
        _marked(job, name)
    started = progress.Progress.__init__

    def clock_starts(self, *args, **kwargs) -> None:
        MARKS.append(("clock", time.perf_counter()))
        started(self, *args, **kwargs)

    progress.Progress.__init__ = clock_starts

    fetched = idle_gaps.IdleGaps.fetched

    def on_fetch(self, step_id, graph, samples):  # graph: a bool in older checkouts, a kind now
        if self._last_fetched == step_id - 1:
            ring = idle_gaps.RING
            before, now = self._marks[(step_id - 1) % ring][1], self._marks[step_id % ring][0]
            GAPS.append((step_id, before.elapsed_time(now)))
        return fetched(self, step_id, graph, samples)

    idle_gaps.IdleGaps.fetched = on_fetch
    launch, fetch = cuda_runner.CudaRunner.launch, cuda_runner.CudaRunner.fetch

    def timed_launch(self, inputs):
        t0 = time.perf_counter()
        if len(EAGER) in PROFILE and not inputs.decode_only:
            handle = _profiled(launch, PROFILE.pop(len(EAGER)), self, inputs)
        else:
            handle = launch(self, inputs)
        if not inputs.decode_only:  # an older checkout's handle has no ``replayed``
            took = 1e3 * (time.perf_counter() - t0)
            EAGER[handle.step_id] = [took, inputs.num_tokens, None, getattr(handle, "replayed", False)]
        return handle

    def busy_fetch(self, handle):
        result = fetch(self, handle)
        if handle.step_id in EAGER:
            slot = self.slots[handle.slot]
            EAGER[handle.step_id][2] = slot.compute_start.elapsed_time(slot.compute_done)
        return result

    cuda_runner.CudaRunner.launch, cuda_runner.CudaRunner.fetch = timed_launch, busy_fetch


def _profiled(fn, out: Path, *args):
    """``fn(*args)`` under cProfile; the top functions by own and by cumulative time go to ``out``."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    try:
        return prof.runcall(fn, *args)
    finally:
        text = io.StringIO()
        for key in ("tottime", "cumulative"):
            pstats.Stats(prof, stream=text).sort_stats(key).print_stats(45)
        out.write_text(text.getvalue())


def _report(stats: dict, wave: int) -> None:
    engine = stats["engine"]
    wall, tokens = stats["wall_s"], stats["completion_tokens"]
    by_place = collections.Counter()
    for step, gap in GAPS:
        by_place[f"b{step % wave}" if step % wave < 4 else "rest"] += gap / 1e3
    pauses = [gap for step, gap in GAPS if step % wave >= 4 and gap > 1]
    print(f"wall {wall:.2f} s, {tokens / wall / 1e3:.1f}k tok/s; engine {engine['wall_s']:.2f} s, GPU busy "
          f"{engine['gpu_busy_s']:.2f} s ({100 * engine['gpu_busy_s'] / engine['wall_s']:.1f} %); idle "
          f"{sum(by_place.values()):.3f} s: " + ", ".join(f"{k} {v:.3f}" for k, v in sorted(by_place.items()))
          + f"; pauses > 1 ms outside b0-b3: {len(pauses)}, {sum(pauses) / 1e3:.3f} s")  # fmt: skip
    clock = dict(MARKS)["clock"]
    print("phases (s from the run's clock): " + " ".join(f"{k}={t - clock:.3f}" for k, t in MARKS))
    for replayed, name in ((False, "eager steps"), (True, "mixed graph steps")):
        steps = [v for _, v in sorted(EAGER.items()) if v[2] is not None and v[3] == replayed]
        if steps:
            print(f"{name}: {len(steps)}, host launch mean {sum(v[0] for v in steps) / len(steps):.2f} ms, "
                  f"busy mean {sum(v[2] for v in steps) / len(steps):.2f} ms, tokens mean "
                  f"{sum(v[1] for v in steps) / len(steps):.0f}; first three (launch, busy ms): "
                  f"{[(round(v[0], 1), round(v[2], 1)) for v in steps[:3]]}")  # fmt: skip
    launches = [p for p in PHASES if p[0] == "_launch_next"]
    for w in (10, 20):
        if len(launches) < w * wave + 4:
            break
        a, b = launches[w * wave - 2][1], launches[w * wave + 3][2]
        print(f"wave {w}: " + " | ".join(f"{n[1:]} +{(x - a) * 1e3:.2f} {(y - x) * 1e3:.2f}"
                                         for n, x, y in PHASES if a <= x <= b))  # fmt: skip
        near = [(s, g) for s, g in GAPS if w * wave - 2 <= s <= w * wave + 4]
        print("   idle ms before steps: " + " ".join(f"{s}:{g:.2f}" for s, g in near))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--model", type=Path, default=None, help="a checkpoint (default: a random one, cached)")
    ap.add_argument("--package-root", default=None, help="import batchgen from here")
    ap.add_argument("--profile-eager", type=int, nargs="*", default=[], metavar="N",
                    help="cProfile the N-th eager launches (0 = the first: Triton's start)")  # fmt: skip
    ap.add_argument("--staggered", action="store_true", help="rows of 16-496 new tokens (mean 256)")
    args = ap.parse_args()
    if args.package_root:
        sys.path.insert(0, args.package_root)
    args.out.mkdir(parents=True, exist_ok=True)
    prompts, model = _inputs(args.rows, args.model, args.staggered)
    PROFILE.update({n: args.out / f"eager_{n}.prof.txt" for n in args.profile_eager})
    _instrument()
    from batchgen.cli import cli

    stats_file = args.out / "stats.json"
    argv = ["run", str(prompts), str(args.out / "out.jsonl"), "--model", str(model), "--max-new-tokens",
            "256", "--ignore-eos", "--device", "cuda", "--no-progress", "--overwrite", "--stats-file",
            str(stats_file)]  # fmt: skip
    with contextlib.suppress(SystemExit):  # the command's exit code; the stats file says how it went
        cli.main(argv, standalone_mode=False)
    _report(json.loads(stats_file.read_text()), 256)


if __name__ == "__main__":
    main()
