"""Sharding, Slurm arrays, ``merge`` and ``--data-parallel``: every row exactly once, in input order,
with the same records an unsharded run writes (sampled ones included)."""

import io
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from batchgen.app.shards import Shard, parse_shard, shard_of_path, shard_output, shard_rows, slurm_shard
from batchgen.cli import cli
from batchgen.io.checkpoint import load_state, save_state
from tests.helpers import ROWS, by_index, read_records, write_jsonl, write_parquet

pytestmark = pytest.mark.usefixtures("one_torch_thread")
MORE_ROWS = ROWS + [{"id": f"x{i}", "prompt": f"Say the number {i}."} for i in range(6)]  # 11 rows
SAMPLED = ["--temperature", "0.9", "--seed", "7", "--n", "2"]


def byte_split(path, count: int) -> list[list[int]]:
    """Reference: the row indices of each of ``count`` byte-range shards of a plain JSONL file (a row
    belongs to the range its line starts in; blank lines are not rows)."""
    data = Path(path).read_bytes()
    shards, pos, row = [[] for _ in range(count)], 0, 0
    for line in io.BytesIO(data):
        if line.strip():
            shards[next(i for i in range(count) if pos < (i + 1) * len(data) // count)].append(row)
            row += 1
        pos += len(line)
    return shards


def test_parse_shard_and_slurm_environment():
    assert parse_shard("2/8") == Shard(2, 8) and parse_shard(" 0 / 1 ") == Shard(0, 1)
    for bad in ("8/8", "1", "a/b", "-1/4", "1/0"):
        with pytest.raises(ValueError, match="--shard"):
            parse_shard(bad)
    assert slurm_shard({}) is None
    env = {"SLURM_ARRAY_TASK_ID": "12", "SLURM_ARRAY_TASK_MIN": "10", "SLURM_ARRAY_TASK_COUNT": "4"}
    assert slurm_shard(env) == Shard(2, 4)
    with pytest.raises(ValueError, match="contiguous array"):
        slurm_shard({**env, "SLURM_ARRAY_TASK_ID": "20"})


def test_shard_names():
    assert shard_output("out/res.jsonl", Shard(3, 16)) == "out/res.shard-00003-of-00016.jsonl"
    assert shard_output("res.PARQUET", Shard(0, 2)) == "res.shard-00000-of-00002.PARQUET"
    assert shard_output("run-{shard}/res.jsonl", Shard(1, 2)) == "run-00001-of-00002/res.jsonl"
    assert shard_of_path("out/res.shard-00003-of-00016.jsonl") == Shard(3, 16)


@pytest.mark.parametrize("limit", [None, 5])
def test_shard_rows_cover_every_row_once(limit):
    for total in range(0, 23):
        for count in range(1, 8):
            seen = []
            for i in range(count):
                start, stop = shard_rows(total, Shard(i, count), limit)
                seen += list(range(start, total if stop is None else stop))
            rows = total if limit is None else min(total, limit)
            assert seen == list(range(rows)), (total, count)
            sizes = [len(range(*shard_rows(total, Shard(i, count), 10**9))) for i in range(count)]
            assert max(sizes) - min(sizes) <= 1  # balanced


@pytest.fixture
def run_cli(tiny_llama):
    def _run(*args, env=None):
        argv = ["run", *map(str, args), "--model", tiny_llama, "--max-num-seqs", "4", "--max-new-tokens", "4"]
        result = CliRunner(env=env).invoke(cli, argv, catch_exceptions=False)
        return result.exit_code, result.stderr

    return _run


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_shards_then_merge_equal_an_unsharded_run(run_cli, tmp_path, fmt):
    src = write_jsonl(tmp_path / "in.jsonl", MORE_ROWS)
    whole, out = tmp_path / f"whole.{fmt}", tmp_path / f"res.{fmt}"
    assert run_cli(src, whole, *SAMPLED)[0] == 0
    assert run_cli(src, out, "--shard", "0/3", *SAMPLED)[0] == 0
    # Shard 1 from a Slurm array task (no --shard): task 5 of an array 4..6.
    slurm = {"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_MIN": "4", "SLURM_ARRAY_TASK_COUNT": "3"}
    assert run_cli(src, out, *SAMPLED, env=slurm)[0] == 0
    merge = CliRunner().invoke(cli, ["merge", str(out)])
    assert merge.exit_code == 1 and "1 of 3 shards" in merge.stderr and ": 2" in merge.stderr
    assert run_cli(src, out, "--shard", "2/3", *SAMPLED)[0] == 0
    parts = [read_records(tmp_path / f"res.shard-0000{i}-of-00003.{fmt}") for i in range(3)]
    indices = [sorted({r["index"] for r in p}) for p in parts]
    assert indices == byte_split(src, 3) == [[0, 1, 2], [3, 4, 5], [6, 7, 8, 9, 10]]  # by bytes, not rows
    status = CliRunner().invoke(cli, ["status", str(out)])
    assert "all 3 shards: 11/11 rows" in status.output and "complete" in status.output

    assert CliRunner().invoke(cli, ["merge", str(out)]).exit_code == 0
    merged = read_records(out)
    assert merged == by_index(merged) and merged == by_index(read_records(whole))
    code, err = run_cli(src, out, *SAMPLED)  # the unsharded command on the merged output: done
    assert code == 0 and "already complete" in err


# Blank and whitespace-only lines (not rows), CRLF endings, an indented row, a malformed row (an error
# record, still a row), and a last line without a newline.
TRICKY = b"".join(
    [b"\n", b'{"id": "a", "prompt": "Hello there"}\n', b"\n\n", b'{"id": "b", "prompt": "Count"}\r\n']
    + [b'{"id": "c%d", "prompt": "Say %d"}\n' % (i, i) for i in range(4)]
    + [b"  \r\n", b' \t{"id": "d", "prompt": "Why?"}\n', b"{oops\n", b" \t \n", b'{"id": "e"}\r\n']
    + [b'{"id": "f%d", "prompt": "%s"}\n' % (i, b"word " * i) for i in range(3)]
    + [b"\r\n", b'{"id": "g", "prompt": "The end"}']
)


def test_byte_range_shards_of_1_3_7_merge_to_identical_files(run_cli, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_bytes(TRICKY)
    whole = tmp_path / "whole.jsonl"
    assert run_cli(src, whole)[0] == 0
    merged = []
    for count in (1, 3, 7):
        out = tmp_path / f"n{count}" / "res.jsonl"
        for i in range(count):
            assert run_cli(src, out, "--shard", f"{i}/{count}")[0] == 0
        parts = [read_records(shard_output(str(out), Shard(i, count))) for i in range(count)]
        assert [sorted(r["index"] for r in p) for p in parts] == byte_split(src, count)
        assert CliRunner().invoke(cli, ["merge", str(out)]).exit_code == 0
        merged.append(out.read_bytes())
    assert merged[0] == merged[1] == merged[2]
    shard = shard_output(str(tmp_path / "n3" / "res.jsonl"), Shard(1, 3))  # as an older batchgen left it:
    state = load_state(shard)  # split by rows, not bytes
    state.fingerprint.pop("split")
    save_state(shard, state)
    code, err = run_cli(src, tmp_path / "n3" / "res.jsonl", "--shard", "1/3")
    assert code == 1 and "split: (unset) -> 'bytes'" in err and "--overwrite" in err
    records = read_records(tmp_path / "n7" / "res.jsonl")
    assert records == by_index(read_records(whole)) and len(records) == 13  # the same rows, same indices
    assert [r["id"] for r in records][-2:] == ["f2", "g"] and records[7]["finish_reason"] == "error"


def test_shard_placeholder_and_empty_shards(run_cli, tmp_path):
    src = write_parquet(tmp_path / "in.parquet", ROWS[:2])
    out = tmp_path / "run-{shard}" / "res.jsonl"
    for i in range(3):  # 2 rows over 3 shards: one shard is empty, and still completes
        assert run_cli(src, out, "--shard", f"{i}/3")[0] == 0
    for _ in range(2):  # merging again finds the same 3 shards, not the merged run-all as a 4th
        assert CliRunner().invoke(cli, ["merge", str(out)]).exit_code == 0
    merged = read_records(tmp_path / "run-all" / "res.jsonl")
    assert [(r["index"], r["id"]) for r in merged] == [(0, "a"), (1, "b")]
    assert "all 3 shards: 2/2 rows" in CliRunner().invoke(cli, ["status", str(out)]).output
    code, err = run_cli(src, out)
    assert code == 2 and "{shard}" in err


def test_merge_refuses_mixed_jobs_counts_and_foreign_targets(run_cli, tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", ROWS)
    out = tmp_path / "res.jsonl"
    assert run_cli(src, out, "--shard", "0/2", "--seed", "1")[0] == 0
    assert run_cli(src, out, "--shard", "1/2", "--seed", "2")[0] == 0
    mixed = CliRunner().invoke(cli, ["merge", str(out)])
    assert mixed.exit_code == 1 and "other settings than shard 0" in mixed.stderr and "seed" in mixed.stderr
    assert run_cli(src, out, "--shard", "1/2", "--seed", "1", "--overwrite")[0] == 0
    assert run_cli(src, out, "--shard", "0/1", "--seed", "1")[0] == 0  # leftovers of another count
    counts = CliRunner().invoke(cli, ["merge", str(out)])
    assert counts.exit_code == 1 and "--count" in counts.stderr
    status = CliRunner().invoke(cli, ["status", str(out)]).output  # the newest split only, not both summed
    assert "all 2 shards" not in status and "5/5 rows" in status
    out.write_text('{"precious": 1}\n')  # not batchgen's: never replaced without being asked
    foreign = CliRunner().invoke(cli, ["merge", str(out), "--count", "2"])
    assert foreign.exit_code == 1 and "--overwrite" in foreign.stderr and "precious" in out.read_text()
    assert CliRunner().invoke(cli, ["merge", str(out), "--count", "2", "--overwrite"]).exit_code == 0
    assert [r["index"] for r in read_records(out)] == [0, 1, 2, 3, 4]


def test_worker_devices():
    from batchgen.app.data_parallel import worker_args, worker_devices

    assert worker_devices(2, {"CUDA_VISIBLE_DEVICES": "3,5,7"}, 8) == ["3", "5"]
    assert worker_devices(2, {}, 4) == ["0", "1"]
    assert worker_devices(2, {}, 0) == ["0", "1"]  # no CUDA: the workers share the CPU
    with pytest.raises(ValueError, match="only 1 GPUs"):
        worker_devices(2, {}, 1)
    # --data-parallel 2 --tensor-parallel 2: each worker gets two GPUs
    assert worker_devices(2, {"CUDA_VISIBLE_DEVICES": "3,5,7,9"}, 8, 2) == ["3,5", "7,9"]
    assert worker_devices(2, {}, 4, 2) == ["0,1", "2,3"]
    with pytest.raises(ValueError, match="2 x 2 GPUs but only 3"):
        worker_devices(2, {}, 3, 2)
    args = ["a", "b", "--data-parallel", "2", "--seed=1", "--data-parallel=3"]
    assert worker_args(args) == ["a", "b", "--seed=1", "--no-progress"]
    assert worker_args(["a", "--progress"]) == ["a", "--progress"]


def test_data_parallel_workers_then_merge(tiny_llama, tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", MORE_ROWS)
    out = tmp_path / "res.jsonl"
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    common = ["--model", tiny_llama, "--max-num-seqs", "4", "--max-new-tokens", "4", *SAMPLED]
    dp = ["--data-parallel", "2", "--stats-file", str(tmp_path / "stats.json")]
    cmd = [sys.executable, "-m", "batchgen", "run", src, str(out), *dp, *common]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "res.shard-00001-of-00002.jsonl").exists()
    assert "batchgen[shard 1/2]: complete" in done.stderr  # each worker's lines say whose they are
    stats = json.loads((tmp_path / "stats.json").read_text())  # the job's, beside each shard's own
    assert stats["status"] == "complete" and stats["records"] == 2 * len(MORE_ROWS)
    assert (tmp_path / "stats.shard-00000-of-00002.json").exists()
    whole = tmp_path / "whole.jsonl"
    assert CliRunner().invoke(cli, ["run", src, str(whole), *common]).exit_code == 0
    assert read_records(out) == by_index(read_records(whole))
    for shard in tmp_path.glob("res.shard-*"):  # even without its shards, a finished job stays finished
        shard.unlink() if shard.is_file() else None
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "already complete" in again.stderr


def test_limits_must_tile_and_busy_shards_are_not_merged(run_cli, tmp_path):
    """A shard's rows depend on --limit: a re-run with another limit is refused, and shards of
    different limits (forced with --overwrite) never merge into duplicated or missing rows."""
    from batchgen.io.checkpoint import OutputLock

    src = write_jsonl(tmp_path / "in.jsonl", MORE_ROWS)
    out = tmp_path / "res.jsonl"
    for i in range(2):
        assert run_cli(src, out, "--shard", f"{i}/2", "--limit", "6")[0] == 0
    code, err = run_cli(src, out, "--shard", "0/2", "--limit", "10")
    assert code == 1 and "part" in err
    assert run_cli(src, out, "--shard", "0/2", "--limit", "10", "--overwrite")[0] == 0
    tiles = CliRunner().invoke(cli, ["merge", str(out)])
    assert tiles.exit_code == 1 and "do not tile" in tiles.stderr and "[0, 5), [3, 6)" in tiles.stderr
    assert run_cli(src, out, "--shard", "1/2", "--limit", "10", "--overwrite")[0] == 0
    lock = OutputLock(tmp_path / "res.shard-00001-of-00002.jsonl")
    lock.acquire()  # as if a run still wrote that shard
    try:
        busy = CliRunner().invoke(cli, ["merge", str(out)])
        assert busy.exit_code == 1 and "another batchgen run" in busy.stderr
    finally:
        lock.release()
    assert CliRunner().invoke(cli, ["merge", str(out)]).exit_code == 0
    assert [r["index"] for r in read_records(out)] == list(range(10))


def test_data_parallel_refusals_and_exit_codes(tiny_llama, tmp_path):
    import signal

    from batchgen.app.data_parallel import _exit_code
    from batchgen.app.errors import FatalError
    from batchgen.app.options import RunOptions
    from batchgen.app.run import merged_target_done
    from batchgen.config import EngineConfig

    assert _exit_code(-signal.SIGTERM) == 75 and _exit_code(-signal.SIGKILL) == -signal.SIGKILL
    src = write_jsonl(tmp_path / "in.jsonl", ROWS)
    slurm = {"SLURM_ARRAY_TASK_ID": "20", "SLURM_ARRAY_TASK_COUNT": "4"}
    args = ["run", src, str(tmp_path / "o.jsonl"), "--data-parallel", "2"]
    refused = CliRunner(env=slurm).invoke(cli, args)
    assert refused.exit_code == 2 and "contiguous array" in refused.output
    out = tmp_path / "{shard}" / "res.jsonl"
    engine = EngineConfig(model=tiny_llama, max_num_seqs=4)
    opts = RunOptions(input=src, output=str(out), sampling={"max_new_tokens": 4}, engine=engine)
    assert not merged_target_done(opts)  # nothing merged yet
    foreign = tmp_path / "all" / "res.jsonl"
    foreign.parent.mkdir()
    foreign.write_text("{}\n")
    with pytest.raises(FatalError, match="not written by batchgen"):
        merged_target_done(opts)
    foreign.unlink()
    for i in range(2):
        argv = ["run", src, str(out), "--shard", f"{i}/2", "--model", tiny_llama, "--max-num-seqs", "4"]
        assert CliRunner().invoke(cli, [*argv, "--max-new-tokens", "4"]).exit_code == 0
    assert CliRunner().invoke(cli, ["merge", str(out)]).exit_code == 0
    assert merged_target_done(opts)  # the {shard} output's merged file: a re-run has nothing to do
    assert not merged_target_done(replace(opts, overwrite=True))
