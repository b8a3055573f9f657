"""``-`` on the command line: INPUT ``-`` reads JSONL from stdin; OUTPUT ``-`` is refused.

A stream is read once, from its start: it has no rows to split among shards, and a re-run cannot skip
the rows an earlier run did (nor check they are the same), so a stdin run never resumes. Its OUTPUT must
be new or empty, or ``--overwrite`` given. Each refusal is one line and a usage error (exit 2), raised
before anything is read or written.
"""

from __future__ import annotations

import sys

from batchgen.app.shards import Shard
from batchgen.io.stdin_reader import STDIN
from batchgen.io.writers import OutputError, has_records


def check_dashes(input_path: str, output: str, shard: Shard | None, data_parallel: int) -> None:
    """ValueError for a use of ``-`` that cannot work (a usage error)."""
    if output == STDIN:
        raise ValueError(
            "OUTPUT '-': the output must be a file, since it is written incrementally and resumed"
        )
    if input_path != STDIN:
        return
    if shard is not None or data_parallel > 1:
        how = "--data-parallel" if data_parallel > 1 else "--shard (or a Slurm array task)"
        raise ValueError(f"INPUT '-' (stdin) cannot be split into shards: drop {how}, or give a file")
    if sys.stdin is None or sys.stdin.isatty():
        raise ValueError("INPUT '-' reads JSONL from stdin, which is a terminal: pipe the rows in")


def refuse_resume(input_path: str, output: str, overwrite: bool) -> None:
    """OutputError when a stdin run would have to resume an OUTPUT a run already wrote to."""
    if input_path == STDIN and not overwrite and has_records(output):
        raise OutputError(
            f"{output} already exists, and input from stdin ('-') cannot be resumed: "
            "pass --overwrite to start afresh, or give another OUTPUT"
        )


def resume_advice(input_path: str) -> str:
    """What to do after an interrupted run: resume it, unless its rows came from stdin."""
    if input_path == STDIN:
        return "input from stdin cannot be resumed: re-run with --overwrite to redo it, or give a file"
    return "re-run the same command to resume"
