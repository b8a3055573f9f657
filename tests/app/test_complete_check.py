"""A run's state says complete only when the output holds every (row, sample) it owes (app/coverage.py):
a record the writer lost, or a row the engine never answered, fails the run with one line (exit 1), the
state stays resumable, and a re-run redoes exactly what is missing."""

from __future__ import annotations

import orjson
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from batchgen.app import sink as sink_module
from batchgen.app.coverage import RowSamples, find_gap
from batchgen.cli import cli
from batchgen.engine.completions import CompletionOutput
from batchgen.io.checkpoint import DoneSet, load_state, sidecar_dir
from batchgen.io.writers import JsonlWriter, ParquetWriter

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROWS = [{"id": f"r{i}", "prompt": f"Row {i} says"} for i in range(6)]
OPTIONS = ["--max-new-tokens", "2", "--n", "2", "--temperature", "0.9", "--flush-every", "0"]
LOST = (3, 1)  # (row, sample)
EVERY = {(i, s) for i in range(len(ROWS)) for s in range(2)}


def _keys(out) -> list[tuple[int, int]]:
    if out.suffix == ".parquet":
        table = pq.read_table(out, columns=["index", "sample"]).to_pylist()
        return sorted((r["index"], r["sample"]) for r in table)
    return sorted((r["index"], r["sample"]) for r in map(orjson.loads, out.read_bytes().splitlines()))


def _parts_keys(out) -> list[tuple[int, int]]:
    parts = sorted((sidecar_dir(out) / "parts").glob("part-*.parquet"))
    return sorted((r["index"], r["sample"]) for p in parts for r in pq.read_table(p).to_pylist())


def _lose_in_the_writer(monkeypatch, suffix: str) -> None:
    """The writer takes the record and never writes it: the done set counts it, the output lacks it."""
    writer = JsonlWriter if suffix == ".jsonl" else ParquetWriter
    real = writer.write

    def lossy(self, record):
        if (record["index"], record["sample"]) != LOST:
            real(self, record)

    monkeypatch.setattr(writer, "write", lossy)


def _lose_in_the_engine(monkeypatch, suffix: str) -> None:
    """An output the engine finished never reaches the writer thread: nothing counts it at all."""
    real = sink_module.Sink.put

    def lossy(self, item):
        if not (isinstance(item, CompletionOutput) and (item.index, item.sample) == LOST):
            real(self, item)

    monkeypatch.setattr(sink_module.Sink, "put", lossy)


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
@pytest.mark.parametrize("lose", [_lose_in_the_writer, _lose_in_the_engine])
def test_a_lost_record_fails_the_run_and_a_resume_redoes_it(tiny_llama, tmp_path, monkeypatch, lose, suffix):
    src, out = tmp_path / "in.jsonl", tmp_path / f"out{suffix}"
    src.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in ROWS))
    args = ["run", str(src), str(out), "--model", tiny_llama, *OPTIONS]
    with monkeypatch.context() as patched:
        lose(patched, suffix)
        failed = CliRunner().invoke(cli, args)
    assert failed.exit_code == 1, failed.stderr
    errors = [line for line in failed.stderr.splitlines() if line.startswith("batchgen: error:")]
    assert len(errors) == 1 and "Traceback" not in failed.stderr
    assert "lacks 1 record of this run (the first: row 3, sample 1)" in errors[0]
    assert errors[0].endswith("it is not marked complete: re-run the same command to resume")
    assert not load_state(out).complete
    if suffix == ".jsonl":  # the output as the run wrote it, every other record once
        assert _keys(out) == sorted(EVERY - {LOST})
    else:  # not joined into OUTPUT: the parts stay, as after an interruption
        assert not out.exists() and _parts_keys(out) == sorted(EVERY - {LOST})

    resumed = CliRunner().invoke(cli, args)
    assert resumed.exit_code == 0, resumed.stderr
    assert "11 records already there" in resumed.stderr
    assert _keys(out) == sorted(EVERY)  # the missing one redone, every other kept: each exactly once
    assert load_state(out).complete and load_state(out).records == len(EVERY)


def _done(n: int, keys) -> DoneSet:
    done = DoneSet(n)
    for index, sample in keys:
        done.add(index, sample)
    return done


def test_a_rows_own_n_is_what_it_owes():
    """Run n = 2; row 1 asked for 3 samples and row 2 for 1 (both written by this process); row 0 was
    done before a resume (its own n unknown here: with varied n it owes at least one sample)."""
    owed = RowSamples(2)
    for index, own in ((1, 3), (1, 3), (1, 3), (2, 1), (3, None), (3, None)):
        owed.wrote(index, own)
    keys = [(0, 0), (1, 0), (1, 1), (1, 2), (2, 0), (3, 0), (3, 1)]
    done = _done(2, keys)
    assert find_gap(iter(keys), done, owed, range(4), varied=True) == (0, None)
    assert find_gap(iter(keys[:3] + keys[4:]), done, owed, range(4), varied=True) == (1, (1, 2))
    assert find_gap(iter(keys[:-1]), done, owed, range(4), varied=True) == (1, (3, 1))
    # Written by nobody: row 4 was never answered (owes the run's 2), or was dropped by --on-error skip.
    assert find_gap(iter(keys), done, owed, range(5), varied=False) == (3, (0, 1))
    assert find_gap(iter(keys), done, owed, range(5), varied=True) == (1, (4, 0))
    dropped = _done(1, [(4, 0)])
    assert find_gap(iter(keys), done, owed, range(5), varied=True, dropped=dropped) == (0, None)


def test_duplicates_do_not_hide_a_missing_record():
    """Counts alone would pass an output that holds one record twice and another not at all."""
    owed, keys = RowSamples(1), [(0, 0), (1, 0), (2, 0)]
    done = _done(1, keys)
    assert find_gap(iter([(0, 0), (1, 0), (1, 0)]), done, owed, range(3), varied=False) == (1, (2, 0))
    assert find_gap(iter([(0, 0), (1, 0), (1, 0)]), done, owed, None, varied=False) == (1, None)
