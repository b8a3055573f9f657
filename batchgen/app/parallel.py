"""``--data-parallel K``: K worker processes on one node, one GPU each, as K shards; then ``merge``.

Each worker is ``batchgen run`` with the same arguments plus ``--shard I/K`` and its own
``CUDA_VISIBLE_DEVICES`` (the I-th of the devices this process may use), so a worker is exactly a
shard run: it resumes, drains and reports alone. The workers run in their own session: a terminal's
Ctrl-C reaches only this process, which passes each stop signal on once, so a second Ctrl-C still
means "abandon" to every worker.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Sequence

from batchgen.app.merge import merge
from batchgen.app.run import EXIT_FATAL, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE

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


def worker_devices(count: int, env: dict[str, str], gpus: int) -> list[str]:
    """The device each worker sees: the I-th entry of CUDA_VISIBLE_DEVICES, else GPU I of ``gpus``
    (0 on a machine without CUDA: the workers then share the CPU)."""
    visible = [d.strip() for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    available = len(visible) if visible else gpus
    if available and available < count:
        raise ValueError(f"--data-parallel {count} but only {available} GPUs are visible")
    return [visible[i] if visible else str(i) for i in range(count)]


def run_data_parallel(run_argv: Sequence[str], count: int, output: str) -> int:
    """Run the workers to their end, merge when all completed; the exit code (75 if any was stopped)."""
    import torch

    base = worker_args(run_argv)
    devices = worker_devices(count, dict(os.environ), torch.cuda.device_count())
    workers: list[subprocess.Popen] = []

    def forward(signum: int, frame) -> None:
        for w in workers:
            if w.poll() is None:
                w.send_signal(signum)

    saved = {s: signal.signal(s, forward) for s in _STOP_SIGNALS}  # before any worker exists
    try:
        for i, device in enumerate(devices):
            env = dict(os.environ, CUDA_VISIBLE_DEVICES=device)
            cmd = [sys.executable, "-m", "batchgen", "run", *base, "--shard", f"{i}/{count}"]
            workers.append(
                subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=_die_with_parent)
            )
        log.info("data parallel: %s", ", ".join(f"worker {i} on GPU {d}" for i, d in enumerate(devices)))
        codes = [w.wait() for w in workers]
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    return _finish(codes, output)


def _die_with_parent() -> None:
    """In the worker, before exec: a SIGTERM (drain and save) when the parent dies, SIGKILL included."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: orphaned workers finish their shard alone


def _finish(codes: list[int], output: str) -> int:
    if all(c == EXIT_OK for c in codes):
        merge(output, count=len(codes))
        return EXIT_OK
    failed = [i for i, c in enumerate(codes) if c != EXIT_OK]
    log.info("workers %s did not complete (exit codes %s): re-run the same command to resume", failed, codes)
    if any(c == EXIT_INTERRUPTED for c in codes) and all(c in (EXIT_OK, EXIT_INTERRUPTED) for c in codes):
        return EXIT_INTERRUPTED
    return EXIT_USAGE if all(c in (EXIT_OK, EXIT_USAGE) for c in codes) else EXIT_FATAL
