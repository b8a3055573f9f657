"""A row's own ``n``: that many records, and after a kill a resume that completes exactly those (the done
set alone cannot tell a row with more samples than the run's is unfinished: checkpoint.RunState.varied_n)."""

import shutil
import threading

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from transformers import AutoTokenizer

from batchgen.app import sink as sink_module
from batchgen.app.progress import Counters, Progress
from batchgen.app.sink import RecordOptions, Sink
from batchgen.cli import main
from batchgen.engine.completions import CompletionOutput
from batchgen.io.checkpoint import DoneSet, RunState, load_state, save_state, sidecar_dir
from batchgen.io.faults import Faults
from batchgen.io.records import RowKey
from batchgen.io.writers import JsonlWriter
from tests.support.models import tokenizer_path

# Rows 1, 4, 7, ... ask for 3 samples, the others take the run's 1 (null: not set); sampled, so they differ.
ROWS = [{"id": f"r{i}", "prompt": f"Row {i} says", "n": 3 if i % 3 == 1 else None} for i in range(12)]
OPTIONS = ["--max-new-tokens", "6", "--temperature", "0.9", "--max-num-seqs", "2", "--flush-every", "0"]


def test_the_done_set_keeps_the_samples_past_the_runs_n():
    done = DoneSet(2)
    assert done.add(4, 0) and done.add(4, 2) and not done.add(4, 2)
    assert done.missing(4) == (1,) and done.missing(4, 3) == (1,)
    assert done.add(4, 1)
    assert done.row_done(4) and done.row_done(4, 3) and not done.row_done(4, 4)
    assert done.count == 3 and done.rows_done() == 1


def _write(path, rows) -> None:
    if path.suffix == ".parquet":  # one row group a row: a resume may skip whole groups
        pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=1)
    else:
        path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))


def _records(out) -> list[tuple[int, int, str]]:
    records = [orjson.loads(x) for x in out.read_bytes().splitlines()]
    return sorted((r["index"], r["sample"], r["completion"]) for r in records)


def _run(args) -> int:
    with pytest.raises(SystemExit) as done:
        main(["run", *args])
    return done.value.code


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_a_rows_n_is_honoured_across_an_interruption_and_a_resume(tiny_llama, tmp_path, suffix):
    """The run stopped with row 4 (n = 3) at one sample, every sample of the run's n done: a resume that
    went by the done set alone would skip its row group (Parquet) or its line (JSONL)."""
    source = tmp_path / f"in{suffix}"
    _write(source, ROWS)
    whole, cut = tmp_path / "whole.jsonl", tmp_path / "cut.jsonl"
    args = ["--model", tiny_llama, *OPTIONS]
    assert _run([str(source), str(whole), *args]) == 0
    expected = _records(whole)
    assert [(i, s) for i, s, _ in expected] == [
        (i, s) for i in range(12) for s in range(3 if i % 3 == 1 else 1)
    ]
    state = load_state(whole)
    assert state.varied_n
    shutil.copytree(sidecar_dir(whole), sidecar_dir(cut))
    kept = [x for x in whole.read_bytes().splitlines(keepends=True) if _partial(orjson.loads(x))]
    cut.write_bytes(b"".join(kept))
    state.complete = False
    save_state(cut, state)
    assert _run([str(source), str(cut), *args]) == 0
    assert _records(cut) == expected


def _partial(record: dict) -> bool:
    """What the interrupted run had written: rows 0-5, row 4 only in part."""
    return record["index"] < 6 and (record["index"], record["sample"]) not in ((4, 1), (4, 2))


def test_the_state_says_rows_vary_before_the_first_such_record_is_written(tmp_path):
    out = str(tmp_path / "out.jsonl")
    sidecar_dir(out).mkdir()
    seen: list[bool] = []  # the state on disk as each record is written

    class Writer(JsonlWriter):
        def write(self, record) -> None:
            seen.append(load_state(out) is not None and load_state(out).varied_n)
            super().write(record)

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path())
    progress = Progress(Counters(), 2, log_every=1e9, bar=False)
    sink = Sink(Writer(out), out, DoneSet(1), RunState({}), progress, tokenizer,
                RecordOptions(False, False, "record"), 1e9, threading.Event(), Faults())  # fmt: skip
    sink.put(CompletionOutput(0, 0, RowKey(0, {}), [5], None, "length", 3))
    sink.put(CompletionOutput(1, 0, RowKey(1, {}, n=3), [5], None, "length", 3))
    sink.put(CompletionOutput(1, 1, RowKey(1, {}, n=3), [5], None, "length", 3))
    sink.queue.put(sink_module._Close(complete=False))
    sink.start()
    sink.join()
    assert sink.error is None
    assert seen == [False, True, True]
