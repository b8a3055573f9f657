"""The writer thread: finished outputs -> records -> output file, done set, progress, periodic checkpoints.

Detokenization happens here, off the engine's critical path. Every ``flush_every`` seconds the output is
made durable first and the state file second, so the state never claims more than the file holds. A
failure (a full disk, a bad row under --on-error fail) stops the run: the counters go back to what the
output durably holds, and the state is saved with them when it still can be.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from batchgen.app.coverage import RowSamples, check_complete
from batchgen.app.errors import RowFailed
from batchgen.app.prepare import RowFailure
from batchgen.app.progress import Progress
from batchgen.engine.completions import CompletionOutput
from batchgen.io.checkpoint import DoneSet, RunState, save_state
from batchgen.io.faults import Faults
from batchgen.io.records import RowKey, alternatives, make_record
from batchgen.io.writers import Writer
from batchgen.model.reasoning import split_reasoning
from batchgen.model.tokenize import TokenTexts, batch_decoder
from batchgen.threads import HostTurns

log = logging.getLogger("batchgen")


_BATCH = 256  # outputs taken off the queue (and decoded) at once
_BACKLOG = 4 * _BATCH  # queued outputs past which the writer stops waiting for the engine's turns


class RecordOptions(NamedTuple):
    return_tokens: bool
    logprobs: bool  # the run asks for log-probabilities (error records of rows never parsed get them)
    on_error: str  # record | skip | fail
    # The records feed an OpenAI Batch output (io/openai_output.py): those with log-probabilities hold
    # their tokens' texts too, and a row refused before generation is marked as the request's fault.
    batch_api: bool = False
    reasoning: bool = False  # a reasoning parser is active: every record has ``reasoning``


class _Close(NamedTuple):
    complete: bool


class Sink(threading.Thread):
    def __init__(
        self,
        writer: Writer,
        output: str,
        done: DoneSet,
        state: RunState,
        progress: Progress,
        tokenizer: Any,
        options: RecordOptions,
        flush_every: float,
        stop: threading.Event,
        faults: Faults,
        on_tick: Callable[[], None] = lambda: None,
        turns: HostTurns | None = None,  # on a GPU: write while the engine waits for the device
    ) -> None:
        super().__init__(name="batchgen-writer", daemon=True)
        self.turns = turns
        self.writer, self.output, self.done, self.state = writer, output, done, state
        self.progress, self.options = progress, options
        self.decode = batch_decoder(tokenizer)  # completions' token ids -> texts, many at a time
        self.token_texts = TokenTexts(tokenizer)  # log-probability entries' token texts
        self.flush_every, self.stop, self.faults, self.on_tick = flush_every, stop, faults, on_tick
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.error: BaseException | None = None
        self._last_flush = time.monotonic()
        self.owed = RowSamples(done.n)  # what each row owes, for the check before the state says complete
        self.rows: range | None = None  # the run's rows, once it reached their end (expect())
        self.advice = "re-run the same command to resume"

    def put(self, item: CompletionOutput | RowFailure) -> None:
        self.queue.put(item)

    def expect(self, rows: range, advice: str) -> None:
        """The run went through ``rows``: a complete close checks that the output holds all they owe."""
        self.rows, self.advice = rows, advice

    def close(self, complete: bool) -> None:
        """Write what is queued, flush, save the state (and build the final file when complete)."""
        self.queue.put(_Close(complete))
        self.join()

    def run(self) -> None:
        try:
            while True:
                items = self._take()
                self._take_turn()  # the batch's decode, its first record
                for i, (item, text) in enumerate(zip(items, self._texts(items), strict=True)):
                    if i:
                        self._take_turn()
                    if isinstance(item, _Close):
                        return self._finalize(item.complete)
                    if isinstance(item, RowFailure):
                        self._failure(item)
                    else:
                        self._output(item, text)
                    self._flush_if_due()  # per record: --flush-every 0 makes each durable at once
                if not items:
                    self._flush_if_due()
                self.on_tick()
                self.progress.tick()
        except BaseException as exc:  # the main thread stops the run and reports it
            self.error = exc
            self.stop.set()
            self._save_after_failure(exc)

    def _take_turn(self) -> None:
        """Wait for the engine's turn (threads.HostTurns) unless the backlog has grown: a host-bound
        engine gives few turns, and the outputs must not pile up."""
        if self.turns is not None and self.queue.qsize() < _BACKLOG:
            self.turns.take()

    def _flush_if_due(self) -> None:
        if time.monotonic() - self._last_flush >= self.flush_every:
            self.flush()

    def _take(self) -> list:
        """What is queued, in order, up to a close (waits a short while at most for the first item)."""
        try:
            items = [self.queue.get(timeout=0.25)]
        except queue.Empty:
            return []
        while len(items) < _BATCH and not isinstance(items[-1], _Close):
            try:
                items.append(self.queue.get_nowait())
            except queue.Empty:
                break
        return items

    def _texts(self, items: list) -> list[str | None]:
        """The completions' texts, decoded in one call (off the GIL for fast tokenizers)."""
        todo = [
            i for i, item in enumerate(items)
            if isinstance(item, CompletionOutput) and item.text is None and item.finish_reason != "error"
            and item.thinking is None  # split in parts instead (_reasoning)
        ]  # fmt: skip
        texts: list[str | None] = [getattr(item, "text", None) for item in items]
        for skip in (True, False):
            picked = [i for i in todo if items[i].skip_special_tokens is skip]
            if picked:
                for i, text in zip(
                    picked, self.decode([items[i].token_ids for i in picked], skip), strict=True
                ):
                    texts[i] = text
        return texts

    # -- records ---------------------------------------------------------------------------------------
    def _output(self, out: CompletionOutput, text: str | None) -> None:
        if out.finish_reason == "error" and self._drop_error(out.index, out.key.id, out.error):
            return
        reasoning, text = self._reasoning(out, text)
        record = make_record(
            row_id=out.key.id,
            index=out.index,
            sample=out.sample,
            completion="" if out.finish_reason == "error" else text,
            finish_reason=out.finish_reason,
            prompt_tokens=out.prompt_tokens,
            completion_tokens=len(out.token_ids),
            error=(out.error or "engine error") if out.finish_reason == "error" else None,
            kept=out.key.kept,
            token_ids=list(out.token_ids) if self.options.return_tokens else None,
            logprobs=None if out.logprobs is None else list(out.logprobs),
            top_logprobs=self._alternatives(out.top_logprobs),
            prompt_logprobs=out.prompt_logprobs,
            prompt_top_logprobs=self._alternatives(out.prompt_top_logprobs),
            reasoning=reasoning,
            with_reasoning=self.options.reasoning,
        )
        if self.options.batch_api and out.logprobs is not None:
            record["tokens"] = self.token_texts(list(out.token_ids))  # OpenAI's log-probability entries
        self._write(record, out.key)

    def _reasoning(self, out: CompletionOutput, text: str | None) -> tuple[str | None, str | None]:
        """(reasoning, completion): the thinking block split off the output's text when its row has a
        reasoning parser (model/reasoning.py), else (None, the text)."""
        if out.thinking is None or out.finish_reason == "error":
            return None, text
        skip = out.skip_special_tokens
        return split_reasoning(out.token_ids, out.thinking, lambda seqs: self.decode(seqs, skip), out.text)

    def _alternatives(self, per_token: list[list[tuple[int, float]] | None] | None) -> list | None:
        """Each position's most likely tokens as records hold them (a position without any: null)."""
        if per_token is None:
            return None
        texts = iter(self.token_texts([token for entries in per_token if entries for token, _ in entries]))
        return [
            None if entries is None else alternatives(entries, [next(texts) for _ in entries])
            for entries in per_token
        ]

    def _failure(self, failure: RowFailure) -> None:
        if self._drop_error(failure.index, failure.key.id, failure.error):
            return
        for sample in failure.samples:
            record = make_record(
                row_id=failure.key.id,
                index=failure.index,
                sample=sample,
                completion="",
                finish_reason="error",
                prompt_tokens=failure.prompt_tokens,
                completion_tokens=0,
                error=failure.error,
                kept=failure.key.kept,
                token_ids=[] if self.options.return_tokens else None,
                logprobs=[] if self.options.logprobs else None,
                with_reasoning=self.options.reasoning,
            )
            if self.options.batch_api:
                record["rejected"] = True
            self._write(record, failure.key)

    def _drop_error(self, index: int, row_id: Any, error: str | None) -> bool:
        """--on-error: True when the error writes no record."""
        if self.options.on_error == "fail":
            raise RowFailed(f"row {index} (id {row_id!r}): {error}")
        if self.options.on_error == "skip":
            self.progress.skipped(index, error)
            return True
        return False

    def _write(self, record: dict[str, Any], key: RowKey) -> None:
        index, sample = record["index"], record["sample"]
        if not self.done.add(index, sample):
            log.warning("dropped a duplicate record for row %d sample %d", index, sample)
            return
        if key.n is not None and not self.state.varied_n:
            self.state.varied_n = True  # durable before the record: a resume then reads every row
            save_state(self.output, self.state, self.faults.open_small)
        self.writer.write(record)
        self.owed.wrote(index, key.n)
        self.progress.record(
            record["finish_reason"],
            record["prompt_tokens"],
            record["completion_tokens"],
            row_done=self.done.row_done(index, key.n),
        )
        if record["finish_reason"] == "error":
            self.progress.failed(index, record["error"])

    # -- durability ------------------------------------------------------------------------------------
    def flush(self) -> None:
        self.writer.flush()
        self.progress.mark_durable()
        self.faults.hit("state")
        self._save_state()
        self._last_flush = time.monotonic()

    def _save_state(self) -> None:
        t = self.progress.total
        self.state.rows_done, self.state.records, self.state.errors = t.rows_done, t.records, t.errors
        self.state.prompt_tokens, self.state.completion_tokens = t.prompt_tokens, t.completion_tokens
        self.state.finish_reasons = dict(t.finish_reasons)
        self.state.failed_rows, self.state.skipped = t.failed_rows, t.skipped
        self.state.error_counts = t.error_kinds.as_counts()
        self.state.total_rows = self.progress.total_rows
        self.state.rate_tok_s = round(self.progress.tok_per_s(), 2)
        save_state(self.output, self.state, self.faults.open_small)

    def _finalize(self, complete: bool) -> None:
        self.progress.stop_clock()
        self.flush()
        if complete:
            dropped = self.progress.total.failed if self.options.on_error == "skip" else None
            check_complete(self.writer, self.done, self.owed, self.rows, self.state.varied_n, dropped,
                           self.advice)  # fmt: skip
            self.writer.finish()
            self.state.complete = True
            self._save_state()
        self.writer.close()

    def _save_after_failure(self, error: BaseException) -> None:
        """Keep what was written, durable, unless the failure was the disk's own (a retried write or fsync
        could pass over lost data); count only what is durable; never mask the first error."""
        self.progress.stop_clock()
        try:
            if not isinstance(error, OSError):
                self.writer.flush()
                self.progress.mark_durable()
        except Exception as exc:
            log.debug("could not flush after the failure: %s", exc)
        self.progress.revert_to_durable()
        try:
            self._save_state()
        except Exception as exc:
            log.debug("could not save the state after the failure: %s", exc)
        try:
            self.writer.close()
        except Exception as exc:
            log.debug("could not close the output after the failure: %s", exc)
