"""Streaming input: memory does not grow with the input's size."""

import os
import subprocess
import sys

import orjson


def _write_rows(path, count: int) -> None:
    chunk = 50_000  # write in chunks: the test process itself should not hold 2M rows either
    with open(path, "wb") as f:
        for start in range(0, count, chunk):
            f.write(
                b"".join(
                    orjson.dumps({"id": i, "prompt": f"Row number {i}: say something.", "topic": "x" * 16})
                    + b"\n"
                    for i in range(start, min(start + chunk, count))
                )
            )


def _peak_rss_kib(proc: subprocess.Popen) -> int:
    """The child's own peak RSS (wait4), not the maximum over all children of this process."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_maxrss


def test_peak_rss_does_not_grow_with_input_size(tiny_llama, tmp_path):
    small, big = tmp_path / "small.jsonl", tmp_path / "big.jsonl"
    _write_rows(small, 2_000)
    _write_rows(big, 2_000_000)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = {}
    for name, inp in (("small", small), ("big", big)):
        cmd = [sys.executable, "-m", "batchgen", "run", str(inp), str(tmp_path / f"out-{name}.jsonl")]
        cmd += ["--model", tiny_llama, "--limit", "20", "--max-new-tokens", "4", "--max-num-seqs", "4"]
        procs[name] = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)
    rss = {name: _peak_rss_kib(p) for name, p in procs.items()}
    for name, proc in procs.items():
        assert proc.returncode == 0, proc.stderr.read().decode()
        lines = (tmp_path / f"out-{name}.jsonl").read_bytes().splitlines()
        assert sorted(orjson.loads(x)["index"] for x in lines) == list(range(20))
    print(f"peak RSS KiB: {rss}")
    assert rss["big"] <= 1.25 * rss["small"], rss
