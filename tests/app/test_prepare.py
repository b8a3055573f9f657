"""The prompt thread: rows prepared in chunks give, row for row, what preparing them one at a time gives;
a prompt the tokenizer refuses fails its row only."""

from __future__ import annotations

import threading

import pytest
from transformers import AutoTokenizer

from batchgen.app import prepare
from batchgen.app.prepare import END, Preparer, PromptSettings, RowFailure
from batchgen.config import SamplingParams
from batchgen.engine.completions import GenerationRequest
from batchgen.io.checkpoint import DoneSet
from batchgen.io.row_parser import RowSpec
from batchgen.model.tokenize import encode_prompt
from tests.support.models import tokenizer_path


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(tokenizer_path())


def _rows(count: int) -> list[tuple[int, dict]]:
    rows = [(i, {"id": f"r{i}", "prompt": f"Question {i}: why is the sky blue?"}) for i in range(count)]
    rows[5] = (5, {"id": "bad", "prompt": 7})  # not a string: fails before tokenizing
    rows[9] = (9, {"id": "msgs", "messages": [{"role": "user", "content": "hi"}]})
    rows[12] = (12, {"id": "long", "prompt": "a " * 500})  # too long for max_model_len 256
    return rows


def _run(rows, tokenizer, chunk: int, monkeypatch) -> list:
    monkeypatch.setattr(prepare, "CHUNK_ROWS", chunk)
    failures = []
    settings = PromptSettings(RowSpec(), SamplingParams(max_new_tokens=4), None, None, 256, False)
    worker = Preparer(iter(rows), settings, tokenizer, DoneSet(1), failures.append, threading.Event(), 1000)
    worker.run()
    items = []
    while (chunk := worker.queue.get_nowait()) is not END:
        assert 0 < len(chunk) <= prepare.CHUNK_ROWS  # a chunk's requests, handed over together
        items.extend(chunk)
    assert worker.error is None and worker.reached_end
    return sorted(items + failures, key=lambda item: item.index)


@pytest.mark.parametrize("chunk", [1, 7, 32])
def test_chunks_prepare_every_row_as_one_at_a_time(tokenizer, chunk, monkeypatch):
    rows = _rows(40)
    got = _run(rows, tokenizer, chunk, monkeypatch)
    assert [item.index for item in got] == list(range(40))
    failed = {item.index: item.error for item in got if isinstance(item, RowFailure)}
    assert set(failed) == {5, 12} and "too long" in failed[12]
    for item in got:
        if isinstance(item, GenerationRequest):
            raw = rows[item.index][1]
            assert item.prompt_ids == encode_prompt(tokenizer, raw.get("messages") or raw["prompt"])


def test_a_prompt_the_tokenizer_refuses_fails_only_its_row(tokenizer, monkeypatch):
    real = prepare.encode_rendered

    def refuse_17(tok, texts):
        if any("Question 17:" in t.text for t in texts):
            raise ValueError("cannot encode row 17")
        return real(tok, texts)

    monkeypatch.setattr(prepare, "encode_rendered", refuse_17)
    got = _run(_rows(20), tokenizer, 8, monkeypatch)
    failed = {item.index: item.error for item in got if isinstance(item, RowFailure)}
    assert set(failed) == {5, 12, 17} and failed[17] == "cannot tokenize the prompt: cannot encode row 17"
    assert len(got) == 20


def test_the_preparer_takes_turns_only_while_half_its_queue_is_ready(tokenizer, monkeypatch):
    """On a GPU it renders prompts in the engine's device waits (threads.HostTurns) unless the engine
    could soon run short of rows: with a queue of 4 chunks, the first two chunks go at once."""
    monkeypatch.setattr(prepare, "CHUNK_ROWS", 8)
    settings = PromptSettings(RowSpec(), SamplingParams(max_new_tokens=4), None, None, 256, False)
    waits: list[int] = []

    class Turns:
        def take(self) -> None:
            waits.append(worker.queue.qsize())

    rows = [(i, {"prompt": f"Question {i}"}) for i in range(24)]
    worker = Preparer(
        iter(rows), settings, tokenizer, DoneSet(1), print, threading.Event(), 32, None, Turns()
    )
    worker.run()
    assert worker.queue.maxsize == 4 and worker.error is None
    assert waits == [2] * 8  # the third chunk's rows, with two chunks queued
