"""``--data-parallel K``: K worker processes on one node, one GPU each, as K shards; then ``merge``.

Each worker is ``batchgen run`` with the same arguments plus ``--shard I/K`` and its own
``CUDA_VISIBLE_DEVICES`` (the I-th of the devices this process may use), so a worker is exactly a
shard run: it resumes, drains and reports alone. The workers run in their own session: a terminal's
Ctrl-C reaches only this process, which passes each stop signal on once, so a second Ctrl-C still
means "abandon" to every worker.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from batchgen.app.merge import merge
from batchgen.app.outcome import check_outcome
from batchgen.app.run import EXIT_FATAL, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from batchgen.app.shards import merged_output, shard_of_path
from batchgen.app.status import find_shards
from batchgen.io.checkpoint import load_state

log = logging.getLogger("batchgen")
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


def worker_args(argv: Sequence[str]) -> list[str]:
    """``batchgen run`` arguments without ``--data-parallel K`` (either spelling). Workers draw no
    progress bars unless asked (K bars on one terminal garble): they log plain lines, tagged."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--data-parallel":
            skip = True
        elif not arg.startswith("--data-parallel="):
            out.append(arg)
    if "--progress" not in out and "--no-progress" not in out:
        out.append("--no-progress")
    return out


def worker_devices(count: int, env: dict[str, str], gpus: int, per_worker: int = 1) -> list[str]:
    """The devices each worker sees: the I-th group of ``per_worker`` entries of CUDA_VISIBLE_DEVICES,
    else of GPUs 0..``gpus``-1 (none on a machine without CUDA: the workers then share the CPU)."""
    visible = [d.strip() for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    available = len(visible) if visible else gpus
    if available and available < count * per_worker:
        want = f"{count} x {per_worker} GPUs" if per_worker > 1 else f"{count}"
        raise ValueError(f"--data-parallel {want} but only {available} GPUs are visible")
    ids = visible or [str(i) for i in range(count * per_worker)]
    return [",".join(ids[i * per_worker : (i + 1) * per_worker]) for i in range(count)]


def run_data_parallel(
    run_argv: Sequence[str], count: int, output: str, overwrite: bool = False, stats_file: str | None = None,
    per_worker: int = 1, max_error_rate: float = 1.0,
) -> int:  # fmt: skip
    """Run the workers to their end, merge when all completed; the exit code (75 if any was stopped).
    ``per_worker``: GPUs of each worker (its --tensor-parallel). A RunFailed when the merged output's
    rows failed (``app/outcome.py``), judged on the whole job once it is merged."""
    import torch

    base = worker_args(run_argv)
    devices = worker_devices(count, dict(os.environ), torch.cuda.device_count(), per_worker)
    workers: list[subprocess.Popen] = []
    received: list[int] = []

    def forward(signum: int, frame) -> None:
        received.append(signum)
        for w in workers:
            if w.poll() is None:
                w.send_signal(signum)

    started = time.time()
    saved = {s: signal.signal(s, forward) for s in _STOP_SIGNALS}  # before any worker exists
    try:
        for i, device in enumerate(devices):
            env = dict(os.environ, CUDA_VISIBLE_DEVICES=device)
            cmd = [sys.executable, "-m", "batchgen", "run", *base, "--shard", f"{i}/{count}"]
            worker = subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=_worker_setup)
            workers.append(worker)
            for signum in received:  # a stop that came while the earlier workers were starting
                worker.send_signal(signum)
        log.info("data parallel: %s", ", ".join(f"worker {i} on GPU {d}" for i, d in enumerate(devices)))
        codes = [_exit_code(w.wait()) for w in workers]
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    code = _finish(codes, output, overwrite)
    if stats_file:
        _write_stats(stats_file, output, codes, code, time.time() - started)
    if code == EXIT_OK:
        check_outcome(load_state(merged_output(output)), max_error_rate)
    return code


def _worker_setup() -> None:
    """In the worker, before exec. Stop signals stay blocked until ``batchgen run`` has its handlers
    (a signal in between waits instead of killing it), and the parent's death sends it a SIGTERM
    (drain and save), SIGKILL of the parent included."""
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: orphaned workers finish their shard alone


def _exit_code(returncode: int) -> int:
    """A worker killed by a stop signal (before its handlers existed) was interrupted, not broken."""
    return EXIT_INTERRUPTED if -returncode in _STOP_SIGNALS else returncode


def _finish(codes: list[int], output: str, overwrite: bool) -> int:
    if all(c == EXIT_OK for c in codes) or _shards_complete(output, len(codes)):
        merge(output, count=len(codes), overwrite=overwrite)
        return EXIT_OK
    failed = [i for i, c in enumerate(codes) if c != EXIT_OK]
    stopped = all(c in (EXIT_OK, EXIT_INTERRUPTED) for c in codes)  # else their own lines say what to do
    advice = "re-run the same command to resume" if stopped else "see their errors above"
    log.info("workers %s did not complete (exit codes %s): %s", failed, codes, advice)
    if any(c == EXIT_INTERRUPTED for c in codes) and all(c in (EXIT_OK, EXIT_INTERRUPTED) for c in codes):
        return EXIT_INTERRUPTED
    return EXIT_USAGE if all(c in (EXIT_OK, EXIT_USAGE) for c in codes) else EXIT_FATAL


def _shards_complete(output: str, count: int) -> bool:
    """Every shard finished, though a worker exited 1: its rows failed (its verdict), the job is judged
    on the merged output instead."""
    tags = [(shard_of_path(path), state) for path, state in find_shards(output)]
    states = [state for tag, state in tags if tag is not None and tag.count == count]
    return len(states) == count and all(state.complete for state in states)


def _write_stats(path: str, output: str, codes: list[int], code: int, wall_s: float) -> None:
    """The job's summary (each worker wrote its shard's beside it): the merged state when complete."""
    summary: dict = {"status": "complete" if code == EXIT_OK else "interrupted" if code == EXIT_INTERRUPTED
                     else "failed", "workers": len(codes), "exit_codes": codes, "wall_s": wall_s}  # fmt: skip
    state = load_state(merged_output(output)) if code == EXIT_OK else None
    if state is not None:
        summary |= {k: getattr(state, k) for k in ("rows_done", "records", "errors", "prompt_tokens",
                                                    "completion_tokens", "finish_reasons")}  # fmt: skip
        summary["tokens_per_s"] = state.completion_tokens / wall_s if wall_s > 0 else 0.0
    Path(path).write_text(json.dumps(summary, indent=2) + "\n")
