"""A stop signal before the run's own handlers are set (SPEC.md, "Signals, exit codes, errors"): exit 75
with the one line that says nothing started, and nothing written."""

from __future__ import annotations

import os
import subprocess
import sys

import orjson

from batchgen.io.checkpoint import sidecar_dir

# The real command line in a fresh process (its exit goes through main's own ending), with SIGTERM sent
# while the input's head is read: after the command set its early handlers, before the run's own.
_STOP_WHILE_READING = """
import os, signal, sys
from batchgen.app import run
from batchgen.cli import main

real = run.check_input

def check_input(reader, opts):
    os.kill(os.getpid(), signal.SIGTERM)
    return real(reader, opts)

run.check_input = check_input
sys.argv = ["batchgen", *sys.argv[1:]]
main()
"""


def test_sigterm_before_any_row_says_so_and_exits_75(tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_bytes(b"".join(orjson.dumps({"prompt": f"Row {i}"}) + b"\n" for i in range(3)))
    argv = [sys.executable, "-c", _STOP_WHILE_READING, "run", str(src), str(out), "--model", "unused"]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 75, done.stderr
    assert done.stderr.strip().splitlines() == [
        "batchgen: SIGTERM: interrupted before any row started; nothing lost, re-run the same command "
        "to start (exit 75)"
    ]
    assert not out.exists() and not sidecar_dir(out).exists()  # nothing to resume, nothing to clean up
