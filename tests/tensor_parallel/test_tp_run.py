"""``batchgen run --tensor-parallel 2`` on the CPU: a kill -9 of rank 0 resumes exactly once, and a
rank that dies ends the job (exit 1) instead of hanging in a collective."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

ROWS = [{"id": f"r{i}", "prompt": f"Row {i}: " + "tell me more " * (i % 5)} for i in range(40)]
OPTIONS = ["--max-new-tokens", "24", "--ignore-eos", "--max-num-seqs", "4", "--flush-every", "0",
           "--no-progress", "--log-every", "0"]  # fmt: skip
DEADLINE_S = 300  # start-up of two processes on a busy 2-core runner, and the generation


def _start(args: list[str]) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", "batchgen", "run", *args]
    return subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)


def _records(path: Path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


def _wait_for_records(proc: subprocess.Popen, out: Path, count: int) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while len(_records(out)) < count:
        assert proc.poll() is None, f"the run ended before {count} records: {proc.stderr.read()}"
        assert time.monotonic() < deadline, "no records before the deadline"
        time.sleep(0.05)


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"  # a zombie has exited
    except FileNotFoundError:
        return True


@pytest.fixture(scope="module")
def job(tiny_llama, tmp_path_factory):
    root = tmp_path_factory.mktemp("tp-run")
    data = root / "in.jsonl"
    data.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in ROWS))
    return root, data, ["--model", tiny_llama, *OPTIONS]


def _sorted(records: list[dict]) -> list[tuple]:
    return sorted((r["index"], r["sample"], r["completion"], r["finish_reason"]) for r in records)


def test_kill_rank_zero_then_resume_exactly_once(job):
    root, data, options = job
    reference = _start([str(data), str(root / "one.jsonl"), *options])
    out = root / "tp.jsonl"
    proc = _start([str(data), str(out), *options, "--tensor-parallel", "2"])
    _wait_for_records(proc, out, 5)
    workers = _children(proc.pid)
    assert workers, "rank 0 started no worker"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while not all(_gone(w) for w in workers):  # rank 0's death kills its workers
        assert time.monotonic() < deadline, "a worker outlived rank 0"
        time.sleep(0.1)
    done = len(_records(out))
    assert 0 < done < len(ROWS)
    resumed = _start([str(data), str(out), *options, "--tensor-parallel", "2"])
    assert resumed.wait(timeout=DEADLINE_S) == 0, resumed.stderr.read()
    assert reference.wait(timeout=DEADLINE_S) == 0, reference.stderr.read()
    got, want = _records(out), _records(root / "one.jsonl")
    assert len(got) == len(ROWS)
    assert _sorted(got) == _sorted(want)  # greedy: the same tokens as one process, every row once


def test_a_dead_worker_ends_the_job(job):
    root, data, options = job
    out = root / "dies.jsonl"
    proc = _start([str(data), str(out), *options, "--tensor-parallel", "2", "--max-new-tokens", "400"])
    _wait_for_records(proc, out, 1)
    os.kill(_children(proc.pid)[0], signal.SIGKILL)
    code = proc.wait(timeout=60)  # seconds, not a hang in a collective
    stderr = proc.stderr.read()
    assert code == 1, stderr
    assert "tensor-parallel rank 1" in stderr and "Traceback" not in stderr
    assert len(_records(out)) < len(ROWS)
