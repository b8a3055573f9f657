"""Prompt preparation in a background thread: rows -> chat template -> token ids -> engine requests.

A bounded queue sits between this thread and the engine, so the engine finds rows ready whenever it has
room, and memory stays flat however long the input is. Bad rows never reach the engine: they go
straight to the writer as failures (or stop the run under ``--on-error fail``).

Rows are prepared ``CHUNK_ROWS`` at a time: their chat templates render one by one (Python) as the rows
arrive, a rendered prompt too long in bytes for the model fails at once (``model/token_bound``: tokenizing
it would cost GiBs; a chunk holds only prompts that might fit, never its raw rows), then the tokenizer
encodes them in one call that releases the GIL (``model/tokenize.encode_rendered``). On a GPU
the engine thread takes the GIL back after every torch call; this thread holding it in transformers'
per-prompt Python was what the engine waited on (B7; ``docs/results.md``).
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from functools import cached_property
from typing import Any, NamedTuple

from batchgen.app.errors import RowFailed
from batchgen.config import SamplingParams
from batchgen.engine.completions import GenerationRequest
from batchgen.engine.grammar import GrammarError
from batchgen.io.checkpoint import DoneSet
from batchgen.io.openai_batch import BatchRequests
from batchgen.io.records import RowKey
from batchgen.io.row_lines import BadLine
from batchgen.io.row_parser import ParsedRow, RowError, RowSpec
from batchgen.model.reasoning import ReasoningParser, Thinking
from batchgen.model.token_bound import TokenBytes, token_bytes
from batchgen.model.tokenize import Rendered, encode_rendered, render_prompt
from batchgen.threads import HostTurns

log = logging.getLogger("batchgen")

END = object()  # the queue's last item (the others are lists of requests): the input is exhausted
CHUNK_ROWS = 32  # rows tokenized in one call


class RowFailure(NamedTuple):
    """A row that is recorded as an error without being generated."""

    index: int
    key: RowKey
    samples: tuple[int, ...]
    error: str
    prompt_tokens: int = 0


class _RenderedRow(NamedTuple):
    """A row that passed every check but the token ones, its prompt rendered to text."""

    index: int
    key: RowKey
    samples: tuple[int, ...]
    params: SamplingParams
    grammar: Any
    text: Rendered


class PromptSettings(NamedTuple):
    spec: RowSpec | BatchRequests  # how a row (or an OpenAI Batch request) becomes a prompt
    base: SamplingParams
    chat: bool | None
    system_prompt: str | None
    max_model_len: int
    fail_fast: bool  # --on-error fail
    chat_template: str | None = None  # --chat-template: replaces the model's
    chat_template_kwargs: dict[str, Any] | None = None  # --chat-template-kwargs (a row's keys win)
    reasoning: ReasoningParser | None = None  # --reasoning-parser's, on the tokenizer: None for none


def template_variables(settings: PromptSettings, row: ParsedRow) -> dict[str, Any] | None:
    """The chat template's extra variables for ``row``: the flag's, then the row's own, key by key."""
    if not row.chat_template_kwargs:
        return settings.chat_template_kwargs
    return {**(settings.chat_template_kwargs or {}), **row.chat_template_kwargs}


class Preparer(threading.Thread):
    def __init__(
        self,
        rows: Iterator[tuple[int, Any]],
        settings: PromptSettings,
        tokenizer: Any,
        done: DoneSet,
        on_failure: Callable[[RowFailure], None],
        stop: threading.Event,
        queue_size: int,  # requests
        grammars: Any = None,  # a GrammarCompiler: constraints compile here, off the engine thread
        turns: HostTurns | None = None,  # on a GPU: prepare while the engine waits for the device
    ) -> None:
        super().__init__(name="batchgen-prepare", daemon=True)
        self.rows = rows
        self.settings = settings
        self.tokenizer = tokenizer
        self.done = done
        self.on_failure = on_failure
        self.grammars = grammars
        self.turns = turns
        self.stop = stop
        # A chunk's requests travel as one list: one hand-over between the threads per chunk, not per row.
        self.queue: queue.Queue = queue.Queue(maxsize=-(-queue_size // CHUNK_ROWS))
        self.error: BaseException | None = None
        self.reached_end = False  # every row of the input (or of --limit) went through
        self.rows_read = 0  # rows taken from the input: a chunk that takes none ends it
        self.warned_identical = False  # n > 1 greedy samples are said to be identical once a run

    def run(self) -> None:
        try:
            rows = iter(self.rows)
            while not self.stop.is_set():
                read = self.rows_read
                ready = []
                for item in self.prepare_many(itertools.islice(rows, CHUNK_ROWS)):
                    if isinstance(item, RowFailure):
                        if self.settings.fail_fast:
                            raise RowFailed(f"row {item.index} (id {item.key.id!r}): {item.error}")
                        self.on_failure(item)
                    else:
                        ready.append(item)
                if ready and not self._put(ready):
                    return
                if self.rows_read == read:
                    self.reached_end = True
                    return
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

    def prepare_many(self, rows: Iterable[tuple[int, Any]]) -> list[GenerationRequest | RowFailure]:
        """Rows in order: parsed and rendered one by one as they are read, encoded together, then checked."""
        parsed = []
        for index, raw in rows:
            self.rows_read += 1
            self._take_turn()
            parsed.append(self._render(index, raw))
        # Rows done before a resume that reads every row (checkpoint.RunState.varied_n) have no samples.
        parsed = [p for p in parsed if p is not None and p.samples]
        rendered = [p for p in parsed if isinstance(p, _RenderedRow)]
        ids = iter(self._encode([p.text for p in rendered]) if rendered else [])
        return [self._request(p, next(ids)) if isinstance(p, _RenderedRow) else p for p in parsed]

    def _take_turn(self) -> None:
        """Wait for the engine's turn (threads.HostTurns) while half the queue is still ready for it."""
        if self.turns is not None and 2 * self.queue.qsize() >= self.queue.maxsize:
            self.turns.take()

    def _encode(self, texts: list[Rendered]) -> list[list[int] | Exception]:
        """Token ids, or for a prompt the tokenizer refuses, its exception (the other rows go on)."""
        try:
            return encode_rendered(self.tokenizer, texts)
        except Exception:  # find the row: one at a time
            return [self._encode_one(text) for text in texts]

    def _encode_one(self, text: Rendered) -> list[int] | Exception:
        try:
            return encode_rendered(self.tokenizer, [text])[0]
        except Exception as exc:
            return exc

    def _render(self, index: int, raw: Any) -> _RenderedRow | RowFailure | None:
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
        if params.n != self.done.n:  # the row's own number of samples
            key, samples = key._replace(n=params.n), self.done.missing(index, params.n)
        if not samples:
            return None
        if params.n > 1 and params.greedy and not self.warned_identical:
            self.warned_identical = True
            log.warning("row %d asks for n = %d samples with greedy decoding: they will be identical "
                        "(set a temperature > 0 to get different ones)", index, params.n)  # fmt: skip
        grammar = None
        if params.constrained:  # cached per distinct constraint: a run-wide schema compiles once
            try:
                grammar = self.grammars.compile(params)
            except GrammarError as exc:
                return RowFailure(index, key, samples, str(exc))
        chat = s.chat if row.chat is None else row.chat
        try:
            text = render_prompt(
                self.tokenizer, row.prompt, chat, s.system_prompt, chat_template=s.chat_template,
                chat_template_kwargs=template_variables(s, row), tools=row.tools,
            )  # fmt: skip
        except Exception as exc:  # chat templates raise anything (jinja errors, KeyError, ...)
            return RowFailure(index, key, samples, f"cannot tokenize the prompt: {exc}")
        too_long = self._too_long(text.text)
        if too_long:
            return RowFailure(index, key, samples, too_long)
        return _RenderedRow(index, key, samples, params, grammar, text)

    @cached_property
    def bytes_bound(self) -> TokenBytes:
        """The most prompt bytes a token of this tokenizer covers (read once, in this thread)."""
        return token_bytes(self.tokenizer)

    def _too_long(self, text: str) -> str | None:
        """Why a prompt cannot fit the model, judged from its bytes before it is tokenized; None if it may."""
        most = self.settings.max_model_len - 1
        limit = self.bytes_bound.max_prompt_bytes(most)
        size = self.bytes_bound.prompt_bytes(text)
        if size <= limit:
            return None
        return (
            f"prompt too long: {size} bytes, more than the {most} tokens the model allows can hold "
            f"(at most {limit} bytes with this tokenizer)"
        )

    def _request(self, p: _RenderedRow, ids: list[int] | Exception) -> GenerationRequest | RowFailure:
        s, index, key, samples, params = self.settings, p.index, p.key, p.samples, p.params
        if isinstance(ids, Exception):
            return RowFailure(index, key, samples, f"cannot tokenize the prompt: {ids}")
        if not ids:
            return RowFailure(index, key, samples, "the prompt is empty")
        if len(ids) >= s.max_model_len:
            error = f"prompt too long: {len(ids)} tokens, the model allows at most {s.max_model_len - 1}"
            return RowFailure(index, key, samples, error, len(ids))
        todo = None if len(samples) == params.n else samples
        thinking = None if s.reasoning is None else Thinking(s.reasoning, s.reasoning.output_begins(ids))
        return GenerationRequest(
            index, ids, params, key=key, samples=todo, grammar=p.grammar, thinking=thinking
        )
