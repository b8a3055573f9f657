"""``batchgen merge`` killed at every point (``BATCHGEN_FAULT=merge-...``, see batchgen/io/faults.py), then
re-run: it ends with the merged file an uninterrupted merge writes, byte for byte, and its complete state.

The shards are written here as a finished shard run leaves them (records in completion order, a complete
state each): merging needs no model. The kills are real SIGKILLs of ``batchgen merge`` subprocesses; each
fault writes a report as it fires, so a test knows the kill came from the point it names.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from batchgen.app.shards import Shard, shard_output
from batchgen.cli import cli
from batchgen.io.checkpoint import RunState, load_state, save_state, sidecar_dir
from batchgen.io.writers import records_to_table

PARTS = [(0, 3), (3, 6), (6, None)]  # three shards over 8 rows, the last open-ended
ROWS = 8
POINTS = [
    "merge-torn:1",  # the temporary file half written (one shard of three)
    "merge-torn:3",  # every shard written, the file not yet synced (Parquet: no footer yet)
    "merge-synced:1",  # the temporary file complete and synced, nothing else changed
    "merge-pending:1",  # the state saying a merge is under way saved, the file not yet renamed
    "merge-renamed:1",  # the merged file in place, its final state not yet saved
]
_VOLATILE = ("updated", "pid", "host")  # of the process that saved a state, not of the job


def _records(start: int, stop: int) -> list[dict]:
    """A shard's records as a run leaves them: in the order they finished, not in row order."""
    records = [
        {"id": f"r{i}", "index": i, "sample": s, "completion": f"answer {i}.{s} " * (i % 3 + 1),
         "finish_reason": "length", "prompt_tokens": 5 + i, "completion_tokens": 4}
        for i in range(start, stop) for s in range(2)
    ]  # fmt: skip
    return records[1::2] + records[::2]


def write_shards(out: Path, fmt: str) -> None:
    for i, (start, stop) in enumerate(PARTS):
        path = shard_output(str(out), Shard(i, len(PARTS)))
        records = _records(start, ROWS if stop is None else stop)
        if fmt == "jsonl":
            Path(path).write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
        else:
            pq.write_table(records_to_table(records), path)
        fingerprint = {"model": "m", "temperature": 0.9, "row_start": start, "part": [start, stop]}
        state = RunState({**fingerprint, "split": "rows"}, n=2, complete=True, exhausted=stop is None)
        state.total_rows = state.rows_done = (ROWS if stop is None else stop) - start
        state.records = len(records)
        sidecar_dir(path).mkdir()
        save_state(path, state)


def _merge(*args: str):
    return CliRunner().invoke(cli, ["merge", *args])


def _killed_merge(out: Path, fault: str, *args: str) -> dict:
    """``batchgen merge OUTPUT`` in a subprocess killed at ``fault``; the fault's report."""
    report = out.parent / "fault.json"
    env = {**os.environ, "BATCHGEN_FAULT": fault, "BATCHGEN_FAULT_REPORT": str(report)}
    cmd = [sys.executable, "-m", "batchgen", "merge", str(out), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, timeout=300)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    return json.loads(report.read_text())


def _job_state(path: Path) -> dict:
    state = asdict(load_state(path))
    return {k: v for k, v in state.items() if k not in _VOLATILE}


@pytest.fixture(params=["jsonl", "parquet"])
def job(tmp_path, request) -> tuple[Path, Path]:
    """(OUTPUT whose shards are finished, the file an uninterrupted merge of them writes)."""
    fmt = request.param
    out, reference = tmp_path / f"res.{fmt}", tmp_path / "reference" / f"res.{fmt}"
    write_shards(out, fmt)
    assert _merge(str(out), "--into", str(reference)).exit_code == 0
    return out, reference


def _assert_merged(out: Path, reference: Path) -> None:
    assert out.read_bytes() == reference.read_bytes()
    assert _job_state(out) == _job_state(reference)
    assert load_state(out).complete and load_state(out).records == 2 * ROWS
    leftovers = sorted(p.name for p in out.parent.iterdir() if p.name.startswith(out.name + "."))
    assert leftovers == [out.name + ".batchgen"]  # no temporary file left beside it


@pytest.mark.parametrize("fault", POINTS)
def test_a_merge_killed_at_any_point_completes_when_rerun(job, fault):
    out, reference = job
    assert _killed_merge(out, fault)["point"] == fault.split(":")[0]
    state = load_state(out)
    assert state is None or not state.complete  # never a complete state beside a partial file
    rerun = _merge(str(out))
    assert rerun.exit_code == 0, rerun.stderr
    _assert_merged(out, reference)
    assert _merge(str(out)).exit_code == 0  # and again: the same file
    _assert_merged(out, reference)


@pytest.mark.parametrize("fault", ["merge-torn:2", "merge-pending:1", "merge-renamed:1"])
def test_a_remerge_killed_over_a_finished_merge_completes(job, fault):
    out, reference = job
    assert _merge(str(out)).exit_code == 0
    _killed_merge(out, fault)
    assert _merge(str(out)).exit_code == 0
    _assert_merged(out, reference)


def test_a_file_batchgen_did_not_write_is_still_refused(job):
    out, reference = job
    out.write_text('{"precious": 1}\n')
    _killed_merge(out, "merge-synced:1", "--overwrite")  # killed before it changed anything but its temp
    refused = _merge(str(out))
    assert refused.exit_code == 1 and "not written by batchgen" in refused.stderr
    assert "precious" in out.read_text() and not Path(f"{out}.merging").exists()  # the temp cleaned
    _killed_merge(out, "merge-pending:1", "--overwrite")  # the same command re-run, killed later
    assert _merge(str(out), "--overwrite").exit_code == 0
    _assert_merged(out, reference)
