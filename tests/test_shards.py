"""Sharding, Slurm arrays, ``merge`` and ``--data-parallel``: every row exactly once, in input order,
with the same records an unsharded run writes (sampled ones included)."""

import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from batchgen.app.shards import Shard, parse_shard, shard_of_path, shard_output, shard_rows, slurm_shard
from batchgen.cli import cli
from tests.test_cli import ROWS, by_index, read_records, write_jsonl, write_parquet

pytestmark = pytest.mark.usefixtures("one_torch_thread")
MORE_ROWS = ROWS + [{"id": f"x{i}", "prompt": f"Say the number {i}."} for i in range(6)]  # 11 rows
SAMPLED = ["--temperature", "0.9", "--seed", "7", "--n", "2"]


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
    assert [sorted({r["index"] for r in p}) for p in parts] == [[0, 1, 2], [3, 4, 5, 6], [7, 8, 9, 10]]
    status = CliRunner().invoke(cli, ["status", str(out)])
    assert "all 3 shards: 11/11 rows" in status.output and "complete" in status.output

    assert CliRunner().invoke(cli, ["merge", str(out)]).exit_code == 0
    merged = read_records(out)
    assert merged == by_index(merged) and merged == by_index(read_records(whole))
    code, err = run_cli(src, out, *SAMPLED)  # the unsharded command on the merged output: done
    assert code == 0 and "already complete" in err


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
    out.write_text('{"precious": 1}\n')  # not batchgen's: never replaced without being asked
    foreign = CliRunner().invoke(cli, ["merge", str(out), "--count", "2"])
    assert foreign.exit_code == 1 and "--overwrite" in foreign.stderr and "precious" in out.read_text()
    assert CliRunner().invoke(cli, ["merge", str(out), "--count", "2", "--overwrite"]).exit_code == 0
    assert [r["index"] for r in read_records(out)] == [0, 1, 2, 3, 4]


def test_worker_devices():
    from batchgen.app.parallel import worker_args, worker_devices

    assert worker_devices(2, {"CUDA_VISIBLE_DEVICES": "3,5,7"}, 8) == ["3", "5"]
    assert worker_devices(2, {}, 4) == ["0", "1"]
    assert worker_devices(2, {}, 0) == ["0", "1"]  # no CUDA: the workers share the CPU
    with pytest.raises(ValueError, match="only 1 GPUs"):
        worker_devices(2, {}, 1)
    args = ["a", "b", "--data-parallel", "2", "--seed=1", "--data-parallel=3"]
    assert worker_args(args) == ["a", "b", "--seed=1", "--no-progress"]
    assert worker_args(["a", "--progress"]) == ["a", "--progress"]


def test_data_parallel_workers_then_merge(tiny_llama, tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", MORE_ROWS)
    out = tmp_path / "res.jsonl"
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    common = ["--model", tiny_llama, "--max-num-seqs", "4", "--max-new-tokens", "4", *SAMPLED]
    cmd = [sys.executable, "-m", "batchgen", "run", src, str(out), "--data-parallel", "2", *common]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "res.shard-00001-of-00002.jsonl").exists()
    assert "batchgen[shard 1/2]: complete" in done.stderr  # each worker's lines say whose they are
    whole = tmp_path / "whole.jsonl"
    assert CliRunner().invoke(cli, ["run", src, str(whole), *common]).exit_code == 0
    assert read_records(out) == by_index(read_records(whole))
    for shard in tmp_path.glob("res.shard-*"):  # even without its shards, a finished job stays finished
        shard.unlink() if shard.is_file() else None
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "already complete" in again.stderr
