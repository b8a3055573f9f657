"""The prompt thread: rows prepared in chunks give, row for row, what preparing them one at a time gives;
a prompt the tokenizer refuses fails its row only."""

from __future__ import annotations

import threading

import pytest
from transformers import AutoTokenizer

from batchgen.app import prepare
from batchgen.app.prepare import END, Preparer, PromptSettings, RowFailure
from batchgen.config import SamplingParams
from batchgen.engine.outputs import GenerationRequest
from batchgen.io.checkpoint import DoneSet
from batchgen.io.rows import RowSpec
from batchgen.model.tokenize import encode_prompt
from batchgen.testing.models import tokenizer_path


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
    while (item := worker.queue.get_nowait()) is not END:
        items.append(item)
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
