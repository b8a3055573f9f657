"""The writer thread: on a GPU it writes in the engine's device waits (threads.HostTurns) until its backlog
grows, and every output is written either way."""

from __future__ import annotations

import json
import threading
import time

from transformers import AutoTokenizer

from batchgen.app import sink as sink_module
from batchgen.app.progress import Counters, Progress
from batchgen.app.sink import RecordOptions, Sink
from batchgen.engine.completions import CompletionOutput
from batchgen.io.checkpoint import DoneSet, RunState, load_state, sidecar_dir
from batchgen.io.faults import Faults
from batchgen.io.records import RowKey
from batchgen.io.writers import open_output
from tests.support.models import tokenizer_path


def test_the_writer_takes_turns_until_its_backlog_grows(tmp_path, monkeypatch):
    monkeypatch.setattr(sink_module, "_BATCH", 4)
    monkeypatch.setattr(sink_module, "_BACKLOG", 6)
    backlog: list[int] = []  # queued outputs at each turn taken

    class Turns:
        def take(self) -> None:
            backlog.append(sink.queue.qsize())

    out = str(tmp_path / "out.jsonl")
    sidecar_dir(out).mkdir()  # where the run's lock made it: the checkpoint state is saved there
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path())
    options = RecordOptions(return_tokens=False, logprobs=False, on_error="record")
    progress = Progress(Counters(), 20, log_every=1e9, bar=False)
    sink = Sink(open_output(out), out, DoneSet(1), RunState({}), progress, tokenizer, options, 1e9,
                threading.Event(), Faults(), turns=Turns())  # fmt: skip
    ids = tokenizer.encode("a short answer", add_special_tokens=False)
    for i in range(20):  # queued before the thread starts, with the close: a backlog of 21
        sink.put(CompletionOutput(i, 0, RowKey(i, {}), ids, None, "length", 3))
    sink.queue.put(sink_module._Close(complete=True))
    sink.start()
    sink.join()
    assert sink.error is None
    with open(out) as f:
        records = [json.loads(line) for line in f]
    assert [r["index"] for r in records] == list(range(20))
    assert {r["completion"] for r in records} == {tokenizer.decode(ids)}
    # Batches of 4 leave 17, 13, 9 queued (no turns), then 5, 1, 0: a turn per record (the first one's
    # also covers the batch's decode).
    assert backlog == [5] * 4 + [1] * 4 + [0]


def test_the_saved_rate_is_the_summary_rate(tmp_path):
    """``status`` shows the state's rate; the run's summary its own: one definition, one clock."""
    out = str(tmp_path / "out.jsonl")
    sidecar_dir(out).mkdir()
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path())
    progress = Progress(Counters(), 8, log_every=1e9, bar=False)
    sink = Sink(open_output(out), out, DoneSet(1), RunState({}), progress, tokenizer,
                RecordOptions(False, False, "record"), 1e9, threading.Event(), Faults())  # fmt: skip
    sink.start()
    for i in range(8):
        sink.put(CompletionOutput(i, 0, RowKey(i, {}), [9, 10, 11], None, "length", 3))
    sink.close(complete=True)
    time.sleep(0.05)  # the summary comes later than the last save
    summary = progress.summary("complete")
    assert summary["completion_tokens"] == 24 and summary["tokens_per_s"] > 0
    assert load_state(out).rate_tok_s == summary["tokens_per_s"]
