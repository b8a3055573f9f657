"""Durability judged by the file system's calls, not by the writer's own claim (SPEC.md, "Resume").

A SIGKILL keeps what the kernel's page cache holds, so a crash test passes with every fsync removed. Here
the test sees the calls themselves: ``os.fsync`` on the output's data (the JSONL file, or a Parquet part
before its rename) moves the line of what a power loss cannot take, and each state the run saves (its
rename into place) must claim no record past that line. Faults then fail an fsync (ENOSPC) or a write
(EIO): the state still claims nothing unsynced, and after the unsynced data is lost a resume completes
with every (row, sample) exactly once.
"""

from __future__ import annotations

import errno
import io
import json
import os
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from batchgen.cli import cli
from batchgen.io.checkpoint import load_state, sidecar_dir
from batchgen.io.faults import Faults

pytestmark = pytest.mark.usefixtures("one_torch_thread")
ROWS = [{"id": f"r{i}", "prompt": f"Row {i}: " + "tell me more " * (i % 5)} for i in range(16)]
OPTIONS = ["--max-new-tokens", "6", "--max-num-seqs", "4", "--flush-every", "0"]
_FSYNC, _REPLACE = os.fsync, os.replace


class Durability:
    """``os.fsync`` and ``os.replace`` as the run calls them: the records the output holds durably, each
    state's claim beside it, and an fsync of the output's data that fails (``fail_at``: the k-th)."""

    def __init__(self, out: Path, fail_at: int | None = None) -> None:
        self.out, self.parts = os.path.realpath(out), os.path.realpath(sidecar_dir(out) / "parts")
        self.fail_at, self.data_fsyncs = fail_at, 0
        self.synced = _whole_records(out)  # what the test left before this run counts as durable
        self.synced_bytes = out.stat().st_size if out.suffix == ".jsonl" and out.exists() else 0
        self.part_rows: dict[str, int] = {}  # fsynced Parquet parts, not yet renamed into place
        self.claims: list[tuple[int, int]] = []  # (records a saved state claims, records durable then)

    def fsync(self, fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        is_part = path.startswith(self.parts + os.sep) and path.endswith(".parquet.tmp")
        if path != self.out and not is_part:
            return _FSYNC(fd)
        self.data_fsyncs += 1
        if self.data_fsyncs == self.fail_at:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        _FSYNC(fd)
        if is_part:
            self.part_rows[path] = pq.read_metadata(path).num_rows
        else:
            self.synced_bytes = os.fstat(fd).st_size
            with open(path, "rb") as f:  # the run's own descriptor is write-only
                self.synced = f.read(self.synced_bytes).count(b"\n")
        return None

    def replace(self, src, dst) -> None:
        _REPLACE(src, dst)
        if Path(dst).name == "state.json":
            self.claims.append((json.loads(Path(dst).read_bytes())["records"], self.synced))
        elif os.path.realpath(src) in self.part_rows:  # a part is durable once fsynced, then renamed
            self.synced += self.part_rows.pop(os.path.realpath(src))

    def overclaims(self) -> list[tuple[int, int]]:
        return [(claimed, durable) for claimed, durable in self.claims if claimed > durable]


def _whole_records(out: Path) -> int:
    if out.suffix == ".parquet":
        return sum(pq.read_metadata(p).num_rows for p in (sidecar_dir(out) / "parts").glob("part-*.parquet"))
    return out.read_bytes().count(b"\n") if out.exists() else 0


@pytest.fixture
def watch(monkeypatch):
    def start(out: Path, fail_at: int | None = None) -> Durability:
        seen = Durability(out, fail_at)
        monkeypatch.setattr(os, "fsync", seen.fsync)
        monkeypatch.setattr(os, "replace", seen.replace)
        return seen

    return start


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("input") / "in.jsonl"
    src.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in ROWS))
    return src


def _args(src: Path, out: Path, model: str) -> list[str]:
    return ["run", str(src), str(out), "--model", model, *OPTIONS]


def _keys(out: Path) -> list[tuple[int, int]]:
    if out.suffix == ".parquet":
        rows = pq.read_table(out, columns=["index", "sample"]).to_pylist()
        return sorted((r["index"], r["sample"]) for r in rows)
    return sorted((r["index"], r["sample"]) for r in map(orjson.loads, out.read_bytes().splitlines()))


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_the_state_never_claims_a_record_the_output_has_not_fsynced(tiny_llama, source, tmp_path, watch, fmt):
    out = tmp_path / f"out.{fmt}"
    seen = watch(out)
    result = CliRunner().invoke(cli, _args(source, out, tiny_llama))
    assert result.exit_code == 0, result.stderr
    assert seen.data_fsyncs > 1 and seen.synced == len(ROWS)  # --flush-every 0: a sync per flush
    assert seen.overclaims() == [] and seen.claims[-1] == (len(ROWS), len(ROWS))
    assert load_state(out).complete


def _lose_unsynced(out: Path, synced_bytes: int) -> None:
    """Power loss after the failure: what was not fsynced may be gone (after a failed fsync the kernel
    may already have dropped it). Keep the synced bytes and a torn half of the rest."""
    if out.suffix != ".jsonl":
        return  # Parquet parts exist under their names only once fsynced; a failed one was removed
    data = out.read_bytes()
    out.write_bytes(data[:synced_bytes] + data[synced_bytes:][: (len(data) - synced_bytes) // 2])


def _fails_then_resumes_once(args: list[str], out: Path, seen: Durability, failed, watch) -> None:
    assert failed.exit_code == 1, failed.stderr
    errors = [line for line in failed.stderr.splitlines() if line.startswith("batchgen: error:")]
    assert len(errors) == 1 and f"I/O error on {out}" in errors[0]  # the output, or one of its parts
    assert seen.overclaims() == [], seen.claims  # no state counted a record that was not synced
    state = load_state(out)
    assert 0 < state.records <= seen.synced < len(ROWS) and not state.complete
    _lose_unsynced(out, seen.synced_bytes)

    again = watch(out)
    resumed = CliRunner().invoke(cli, args)
    assert resumed.exit_code == 0, resumed.stderr
    assert again.overclaims() == []
    expected = sorted((i, 0) for i in range(len(ROWS)))
    assert _keys(out) == expected  # every (row, sample) exactly once
    assert load_state(out).complete and load_state(out).records == len(ROWS)


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_failed_fsync_counts_nothing_unsynced_and_a_resume_completes_once(
    tiny_llama, source, tmp_path, watch, fmt
):
    out = tmp_path / f"out.{fmt}"
    seen = watch(out, fail_at=4)  # the output's 4th fsync: ENOSPC
    failed = CliRunner().invoke(cli, _args(source, out, tiny_llama))
    assert "No space left on device (ENOSPC)" in failed.stderr
    _fails_then_resumes_once(_args(source, out, tiny_llama), out, seen, failed, watch)


class _OneBadWrite(io.FileIO):
    """The output's data files (not the small state file): once ``room`` bytes went through, one short
    write and then one EIO, as a failing disk block gives; the writes after it work again, so the state
    can still be saved with whatever it claims."""

    room: int | None = 0  # bytes taken before the bad write; None once it happened

    def write(self, data) -> int:
        with memoryview(data) as view, view.cast("B") as flat:
            room = type(self).room
            if room is None or len(flat) <= room:
                type(self).room = None if room is None else room - len(flat)
                return super().write(flat)
            type(self).room = 0 if room else None
            if room:  # a short write first; the call for the rest fails
                return super().write(flat[:room])
            raise OSError(errno.EIO, os.strerror(errno.EIO))


@pytest.mark.parametrize(("fmt", "room"), [("jsonl", 1500), ("parquet", 12_000)])
def test_a_failed_write_counts_nothing_unsynced_and_a_resume_completes_once(
    tiny_llama, source, tmp_path, watch, monkeypatch, fmt, room
):
    def data_file(self, path, mode="wb", buffering=-1, small=False):
        if small:
            return open(path, mode, buffering=buffering)  # noqa: SIM115 - the caller closes it
        raw = _OneBadWrite(path, mode.replace("b", ""))
        return raw if buffering == 0 else io.BufferedWriter(raw)

    out = tmp_path / f"out.{fmt}"
    seen = watch(out)
    with monkeypatch.context() as patched:
        patched.setattr(Faults, "open", data_file)
        patched.setattr(_OneBadWrite, "room", room)
        failed = CliRunner().invoke(cli, _args(source, out, tiny_llama))
    assert "Input/output error (EIO)" in failed.stderr
    _fails_then_resumes_once(_args(source, out, tiny_llama), out, seen, failed, watch)
