"""How long a run took to start: the process's age when the engine was ready and when the first tokens
came back, beside the engine's own phases (model, KV pool, CUDA graphs). Short Slurm array tasks and
``--data-parallel`` workers pay it once each, so the stats file and the log say where it goes."""

from __future__ import annotations

import os
import time
from typing import Any


def process_started() -> float:
    """``time.time()`` when this process started (Linux: /proc), else now."""
    try:
        with open("/proc/self/stat") as f:
            after_name = f.read().rsplit(")", 1)[1].split()  # the name may hold spaces and parentheses
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        started_after_boot = int(after_name[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime
        return time.time() - (uptime - started_after_boot)
    except (OSError, ValueError, IndexError, AttributeError):
        return time.time()


def startup_summary(started: float, engine_called: float, ready: float, llm: Any) -> dict[str, float]:
    """Seconds from the process's start: ``ready_s`` (engine built; CUDA graphs captured up front under
    tensor parallelism, on demand on one GPU) and
    ``first_token_s``; then the phases: ``before_engine_s`` (interpreter, imports, the input's head,
    resume checks), then the engine's own."""
    out = {"ready_s": round(ready - started, 3)}
    first = getattr(llm.stats, "first_token_time", 0.0)
    if first:
        out["first_token_s"] = round(first - started, 3)
    out["before_engine_s"] = round(engine_called - started, 3)
    return out | dict(getattr(llm, "startup", {}))


def startup_text(summary: dict[str, float]) -> str:
    phases = ", ".join(
        f"{k[:-2].replace('_', ' ')} {v:.1f} s"
        for k, v in summary.items()
        if k not in ("ready_s", "first_token_s")
    )
    return f"engine ready {summary['ready_s']:.1f} s after the process started ({phases})"
