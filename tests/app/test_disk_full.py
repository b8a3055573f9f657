"""A disk that fills up mid-run (``BATCHGEN_FAULT=nospace:N``, see batchgen/io/faults.py): one clear error
line, exit 1, counts of durable records only, and a resume that completes exactly once."""

import re

import orjson
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from batchgen.cli import cli
from batchgen.io.checkpoint import load_state, sidecar_dir

pytestmark = pytest.mark.usefixtures("one_torch_thread")
ROWS = [{"id": f"r{i}", "prompt": f"Row {i}: " + "tell me more " * (i % 5)} for i in range(16)]
OPTIONS = ["--max-new-tokens", "6", "--max-num-seqs", "4", "--flush-every", "0"]


def _sorted_records(out):
    if str(out).endswith(".parquet"):
        return sorted(pq.read_table(out).to_pylist(), key=lambda r: (r["index"], r["sample"]))
    return sorted(out.read_bytes().splitlines(), key=lambda b: orjson.loads(b)["index"])  # bytes


def _whole_records(out) -> int:
    """Records a resume will find: whole lines of the JSONL file, or the rows of the Parquet parts."""
    if str(out).endswith(".parquet"):
        return sum(pq.read_metadata(p).num_rows for p in (sidecar_dir(out) / "parts").glob("*.parquet"))
    return out.read_bytes().count(b"\n")


@pytest.mark.parametrize(("fmt", "room"), [("jsonl", 1500), ("parquet", 12_000)])
def test_a_full_disk_fails_cleanly_then_the_resume_completes_exactly_once(tiny_llama, tmp_path, fmt, room):
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in ROWS))
    args = lambda out: ["run", str(src), str(out), "--model", tiny_llama, *OPTIONS]  # noqa: E731
    whole = tmp_path / f"whole.{fmt}"
    assert CliRunner().invoke(cli, args(whole)).exit_code == 0

    out = tmp_path / f"out.{fmt}"
    full = CliRunner(env={"BATCHGEN_FAULT": f"nospace:{room}"}).invoke(cli, args(out))
    assert full.exit_code == 1 and "Traceback" not in full.stderr
    errors = [line for line in full.stderr.splitlines() if line.startswith("batchgen: error:")]
    assert len(errors) == 1 and "No space left on device (ENOSPC)" in errors[0]
    assert f"I/O error on {out}" in errors[0] and "re-run the same command" in errors[0]
    summary = re.search(r"failed: .*output now (\d+)/16 rows", full.stderr)
    durable, state = int(summary[1]), load_state(out)
    assert 0 < state.records <= durable <= _whole_records(out) < len(ROWS)  # never more than the disk holds
    assert state.rows_done == state.records and not state.complete

    resumed = CliRunner().invoke(cli, args(out))
    assert resumed.exit_code == 0, resumed.stderr
    assert _sorted_records(out) == _sorted_records(whole)  # every record once (JSONL: byte for byte)
    assert load_state(out).complete and load_state(out).records == len(ROWS)
