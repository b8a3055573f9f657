"""Prompt preparation in a background thread: rows -> chat template -> token ids -> engine requests.

A bounded queue sits between this thread and the engine, so the engine finds rows ready whenever it has
room, and memory stays flat however long the input is. Bad rows never reach the engine: they go
straight to the writer as failures (or stop the run under ``--on-error fail``).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from batchgen.app.errors import RowFailed
from batchgen.config import SamplingParams
from batchgen.engine.grammar import GrammarError
from batchgen.engine.outputs import GenerationRequest
from batchgen.io.checkpoint import DoneSet
from batchgen.io.readers import BadLine
from batchgen.io.records import RowKey
from batchgen.io.rows import RowError, RowSpec
from batchgen.model.tokenize import encode_prompt

END = object()  # the queue's last item: the input is exhausted


class RowFailure(NamedTuple):
    """A row that is recorded as an error without being generated."""

    index: int
    key: RowKey
    samples: tuple[int, ...]
    error: str
    prompt_tokens: int = 0


class PromptSettings(NamedTuple):
    spec: RowSpec
    base: SamplingParams
    chat: bool | None
    system_prompt: str | None
    max_model_len: int
    fail_fast: bool  # --on-error fail


class Preparer(threading.Thread):
    def __init__(
        self,
        rows: Iterator[tuple[int, Any]],
        settings: PromptSettings,
        tokenizer: Any,
        done: DoneSet,
        on_failure: Callable[[RowFailure], None],
        stop: threading.Event,
        queue_size: int,
        grammars: Any = None,  # a GrammarCompiler: constraints compile here, off the engine thread
    ) -> None:
        super().__init__(name="batchgen-prepare", daemon=True)
        self.rows = rows
        self.settings = settings
        self.tokenizer = tokenizer
        self.done = done
        self.on_failure = on_failure
        self.grammars = grammars
        self.stop = stop
        self.queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self.error: BaseException | None = None
        self.reached_end = False  # every row of the input (or of --limit) went through

    def run(self) -> None:
        try:
            for index, raw in self.rows:
                if self.stop.is_set():
                    return
                item = self.prepare(index, raw)
                if isinstance(item, RowFailure):
                    if self.settings.fail_fast:
                        raise RowFailed(f"row {index} (id {item.key.id!r}): {item.error}")
                    self.on_failure(item)
                elif not self._put(item):
                    return
            self.reached_end = True
        except BaseException as exc:  # handed to the main thread, which stops the run with it
            self.error = exc
        finally:
            self._put(END)

    def _put(self, item: Any) -> bool:
        """Blocking put that gives up when the run stops (so this thread never hangs on a full queue)."""
        while True:
            try:
                self.queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                if self.stop.is_set():
                    return False

    def prepare(self, index: int, raw: Any) -> GenerationRequest | RowFailure:
        s = self.settings
        samples = self.done.missing(index)
        if isinstance(raw, BadLine):
            return RowFailure(
                index, RowKey(index, {k: None for k in s.spec.keep_columns}), samples, raw.error
            )
        row = s.spec.parse(index, raw)
        if isinstance(row, RowError):
            return RowFailure(index, RowKey(row.id, row.kept), samples, row.error)
        key = RowKey(row.id, row.kept)
        try:
            params = s.base.with_overrides(**row.overrides)
        except (TypeError, ValueError) as exc:
            return RowFailure(index, key, samples, f"bad per-row option: {exc}")
        grammar = None
        if params.constrained:  # cached per distinct constraint: a run-wide schema compiles once
            try:
                grammar = self.grammars.compile(params)
            except GrammarError as exc:
                return RowFailure(index, key, samples, str(exc))
        try:
            ids = encode_prompt(self.tokenizer, row.prompt, s.chat, s.system_prompt)
        except Exception as exc:  # chat templates raise anything (jinja errors, KeyError, ...)
            return RowFailure(index, key, samples, f"cannot tokenize the prompt: {exc}")
        if not ids:
            return RowFailure(index, key, samples, "the prompt is empty")
        if len(ids) >= s.max_model_len:
            error = f"prompt too long: {len(ids)} tokens, the model allows at most {s.max_model_len - 1}"
            return RowFailure(index, key, samples, error, len(ids))
        todo = None if len(samples) == params.n else samples
        return GenerationRequest(index, ids, params, key=key, samples=todo, grammar=grammar)
