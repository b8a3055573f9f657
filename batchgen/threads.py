"""How many cores a CPU run computes on: torch's intra-op threads, and the tokenizers' own pool.

torch's default is one thread per core of the machine. On a machine shared with other work that is the
worst choice: every parallel op waits at a barrier for its slowest thread, and a thread that lost its
core to another process stalls the op for a scheduler time slice. Measured on a 2-core VM at load
average ~6: one decode step of the embedded model took 2.2x longer with 2 threads than with 1.

So the default is the cores this process may run on (``os.sched_getaffinity``: taskset, cgroups, Slurm),
less the cores other work keeps busy by the 1-minute load average, and at least one. ``--threads N``
(``LLM(threads=N)``) overrides it; ``OMP_NUM_THREADS`` caps it. The tokenizers' Rust thread pool is
switched off (``TOKENIZERS_PARALLELISM=false`` unless set): prompts are tokenized one at a time in the
prompt thread, beside the engine, and a pool would only compete with the engine for the same cores.
"""

from __future__ import annotations

import logging
import os

import torch

log = logging.getLogger("batchgen")


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity), else the machine's count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS and Windows have no affinity call
        return max(1, os.cpu_count() or 1)


def busy_cores() -> int:
    """Cores kept busy by other processes, by the 1-minute load average (before this run computes)."""
    try:
        return int(os.getloadavg()[0])
    except (AttributeError, OSError):
        return 0


def default_threads() -> int:
    cores = available_cores()
    threads = max(1, cores - busy_cores())
    omp = os.environ.get("OMP_NUM_THREADS", "")
    if omp.isdigit() and int(omp) > 0:
        threads = min(threads, int(omp))
    return threads


def set_cpu_threads(requested: int | None, device: torch.device) -> int | None:
    """Apply ``--threads`` (or, on the CPU, the default above); the thread count now in use.

    On CUDA with no explicit count nothing changes: the host only schedules there.
    """
    if requested is None and device.type != "cpu":
        return None
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    threads = requested if requested is not None else default_threads()
    torch.set_num_threads(threads)
    log.debug("torch intra-op threads: %d (%d cores available)", threads, available_cores())
    return threads
