"""``batchgen run``: input -> prompt thread -> engine -> writer thread, resumable, interruptible.

Threads: the main thread runs the engine (``llm.stream``) and owns the signal handlers; a preparer
thread reads and tokenizes rows into a bounded queue the engine pulls from; a writer thread decodes,
writes, checkpoints and shows progress. Stopping admission is just the request feed ending: the engine
then finishes what it holds.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from contextlib import nullcontext
from dataclasses import replace
from itertools import islice
from pathlib import Path
from typing import Any

from batchgen.app.batch_input import resolve_input_format
from batchgen.app.errors import FatalError, as_fatal, one_line, rank_lost, storage_failure
from batchgen.app.feed import Feed
from batchgen.app.input_check import comparable, finished_covers, generation_rows, input_identity
from batchgen.app.merge import check_target
from batchgen.app.options import RunOptions
from batchgen.app.outcome import check_outcome
from batchgen.app.prepare import Preparer, PromptSettings
from batchgen.app.progress import Counters, Progress, quiet_transformers_bars, summary_text
from batchgen.app.row_keys import check_every_row_key, row_label
from batchgen.app.shards import SHARD_PLACEHOLDER, merged_output, plan_shard, shard_output
from batchgen.app.signals import Interrupt, SignalControl
from batchgen.app.sink import RecordOptions, Sink
from batchgen.app.sizing import engine_options, total_rows
from batchgen.app.startup import process_started, startup_summary, startup_text
from batchgen.app.stdin_input import refuse_resume, resume_advice
from batchgen.gc_policy import GcPauses, frozen_heap
from batchgen.io.checkpoint import DoneSet, OutputLock, RunState, diff_fingerprints, load_state, save_state
from batchgen.io.faults import Faults
from batchgen.io.openai_batch import BatchRequests
from batchgen.io.openai_output import BatchJob, BatchOutputWriter, created_from
from batchgen.io.readers import Reader, open_input
from batchgen.io.row_lines import BadLine
from batchgen.io.row_parser import ParsedRow, SchemaError
from batchgen.io.writers import OutputError, Writer, has_records, open_output, output_format, remove_output
from batchgen.model.loader import DEFAULT_MODEL_NAME
from batchgen.model.location import check_model_found
from batchgen.model.reasoning import ReasoningParser, parser_for
from batchgen.model.tokenize import tokenizer_for_thread
from batchgen.threads import HostTurns, engine_switching

log = logging.getLogger("batchgen")

EXIT_OK, EXIT_FATAL, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 75
_SCHEMA_ROWS = 100  # rows looked at before the model loads, to fail fast on an unusable input


def run(opts: RunOptions) -> int:
    """Run (or resume) one job; the exit code. Raises InputError/OutputError (usage) or FatalError."""
    try:
        return _run(opts)
    except OSError as exc:  # a full disk, an I/O error, a vanished directory: one line naming the file
        raise storage_failure(exc) from exc


def _run(opts: RunOptions) -> int:
    reader = open_input(opts.input)
    output_format(opts.output)
    refuse_resume(opts.input, opts.output, opts.overwrite)  # of a stdin run: before it reads a row
    opts = resolve_input_format(opts, reader)
    check_input(reader, opts)  # the whole input's head, before an empty shard could hide a bad input
    if opts.shard is not None:
        opts = for_shard(opts, reader)
    elif SHARD_PLACEHOLDER in opts.output:
        raise OutputError(f"{opts.output!r} holds {SHARD_PLACEHOLDER} but the run has no --shard I/N")
    check_every_row_key(reader, opts)  # the rows this run owns: a misspelt parameter fails now, not hours in
    model_name = opts.engine.model or DEFAULT_MODEL_NAME
    fingerprint = opts.fingerprint(model_name, input_identity(reader))
    check_model_found(opts.engine.model)  # before OUTPUT.batchgen/ exists: a missing model leaves nothing
    Path(opts.output).absolute().parent.mkdir(parents=True, exist_ok=True)
    lock = OutputLock(opts.output)
    try:
        lock.acquire()
    except RuntimeError as exc:
        raise FatalError(str(exc)) from None
    try:
        with SignalControl(opts.drain_timeout) as signals:
            return _Job(opts, reader, fingerprint, signals, Faults.from_env()).execute()
    finally:
        lock.release()


def merged_target_done(opts: RunOptions) -> bool:
    """For --data-parallel, before any worker starts: True when the merged OUTPUT already holds this
    whole job (nothing to do); a FatalError when it holds something else, or failed rows (outcome.py)."""
    target = merged_output(opts.output)
    model_name = opts.engine.model or DEFAULT_MODEL_NAME
    reader = open_input(opts.input)
    fingerprint = resolve_input_format(opts, reader).fingerprint(model_name, input_identity(reader))
    state = check_target(target, fingerprint, opts.overwrite)
    if state is None or not state.covers(opts.limit):
        return False
    log.info(
        "%s is already complete (%d rows, %d records): nothing to do", target, state.rows_done, state.records
    )
    check_outcome(state, opts.max_error_rate)
    return True


def for_shard(opts: RunOptions, reader: Reader) -> RunOptions:
    """The options of one shard: its output file and its contiguous rows."""
    shard = opts.shard
    start, stop, split = plan_shard(reader, shard, opts.limit)
    output = shard_output(opts.output, shard)
    last = "the end" if stop is None else stop
    log.info("shard %d of %d: rows %d to %s -> %s", shard.index, shard.count, start, last, output)
    limit = None if stop is None else stop - start
    stats = shard_output(opts.stats_file, shard) if opts.stats_file else None  # one per shard
    return replace(opts, output=output, row_start=start, limit=limit, shard=None, part=(start, stop),
                   split=split, stats_file=stats)  # fmt: skip


def check_input(reader: Reader, opts: RunOptions) -> None:
    """Fail before loading the model when the input is empty or no prompt can come out of it."""
    columns = reader.schema_columns()
    if opts.batch_api:  # each request is checked on its own: a bad one gets its own error line
        if next(islice(reader.iter_rows(opts.row_start, opts.row_stop), 1), None) is None:
            raise FatalError(f"input {opts.input!r} has no rows")
        return
    if columns is not None:
        if reader.count_rows() <= opts.row_start:
            raise FatalError(f"input {opts.input!r} has no rows")
        opts.spec.check_columns(columns, "the Parquet schema")
        opts.spec.check_kept(columns, "the Parquet schema")
        opts.spec.check_keys(columns, "the Parquet schema")
        return
    rows = list(islice(reader.iter_rows(opts.row_start, opts.row_stop), _SCHEMA_ROWS))
    if not rows:
        raise FatalError(f"input {opts.input!r} has no rows")
    objects = [(i, r) for i, r in rows if isinstance(r, dict)]
    if not objects:
        first = rows[0][1]
        why = first.error if isinstance(first, BadLine) else f"a JSON {type(first).__name__}"
        raise SchemaError(f"none of the first {len(rows)} rows is a JSON object (row 0: {why})")
    for i, r in objects:
        opts.spec.check_keys(r, row_label(i, r, opts.spec.id_column))
    seen = list(dict.fromkeys(k for _, r in objects for k in r))
    opts.spec.check_kept(seen, f"the first {len(rows)} rows")
    parsed = [opts.spec.parse(i, r) for i, r in objects]
    if any(isinstance(p, ParsedRow) for p in parsed):
        return
    opts.spec.check_columns(seen, f"the first {len(rows)} rows")
    raise SchemaError(
        f"none of the first {len(rows)} rows has a usable prompt (row {parsed[0].index}: {parsed[0].error})"
    )


class _Job:
    def __init__(
        self, opts: RunOptions, reader: Reader, fingerprint: dict, signals: SignalControl, faults: Faults
    ) -> None:
        self.opts, self.reader, self.fingerprint = opts, reader, fingerprint
        self.signals, self.faults = signals, faults
        self.stop = threading.Event()  # stop admitting rows: a drain or a failure
        self.started, self.engine_called, self.ready = process_started(), 0.0, 0.0
        self.gc_pauses = GcPauses()
        self.parser: ReasoningParser | None = None  # set once the tokenizer is loaded
        self.rows: Any = None  # the rows to generate, set as the output opens (app/input_check.py)

    def execute(self) -> int:
        self.signals.loading = True  # until the engine runs, a signal stops at once
        try:
            resumed = self._open_output()
            if resumed is None:
                return EXIT_OK
            writer, done, totals, state = resumed
            llm = self._load_engine(totals.rows_done)
        except Interrupt:
            self.signals.log_notices()
            log.info("interrupted before generation started; nothing lost, re-run to start")
            return EXIT_INTERRUPTED
        finally:
            self.signals.loading = False
        try:
            return self._generate(llm, writer, done, totals, state)
        finally:
            llm.close()  # tensor-parallel workers stop with the job

    # -- resume ----------------------------------------------------------------------------------------
    def _open_output(self) -> tuple[Writer, DoneSet, Counters, RunState] | None:
        opts, out = self.opts, self.opts.output
        old = load_state(out)
        if opts.overwrite:
            remove_output(out)
            old = None
        elif has_records(out):
            self._check_resumable(old)
            if old.covers(opts.limit) and finished_covers(self.reader, opts, old):
                log.info(
                    "%s is already complete (%d rows, %d records, %d errors): nothing to do",
                    out,
                    old.rows_done,
                    old.records,
                    old.errors,
                )
                self._write_stats({"status": "already complete", "rows_done_total": old.rows_done})
                check_outcome(old, opts.max_error_rate)  # the verdict of the run that wrote it
                return None
        else:
            old = None
        writer = self._writer()
        done, totals = DoneSet(opts.n), Counters()
        for rec in writer.recover():
            if done.add(rec["index"], rec["sample"]):
                totals.add_scanned(rec)
        totals.rows_done = done.rows_done()
        if done.count:
            log.info("resuming %s: %d records already there", out, done.count)
        dropped = getattr(writer, "dropped_bytes", 0)
        if dropped:
            log.info("cut off a torn last record (%d bytes); it is redone", dropped)
        state = RunState(self.fingerprint, n=opts.n)
        if old is not None:
            state.started, state.varied_n = old.started, old.varied_n
        self.rows = generation_rows(self.reader, opts, done, state.varied_n, fresh=old is None)  # may refuse
        save_state(out, state, self.faults.open_small)  # before the first record: records always have a state
        return writer, done, totals, state

    def _writer(self) -> Writer:
        if not self.opts.batch_api:
            return open_output(self.opts.output, self.faults)
        job = BatchJob(self.fingerprint["model"], created_from(self.opts.input))
        return BatchOutputWriter(self.opts.output, job, self.faults)

    def _check_resumable(self, old: RunState | None) -> None:
        out = self.opts.output
        if old is None:
            raise FatalError(
                f"{out} exists but was not written by batchgen run (no state in {out}.batchgen/); "
                "pass --overwrite to replace it"
            )
        diffs = diff_fingerprints(old.fingerprint, comparable(self.fingerprint, old.fingerprint, self.reader))
        if diffs:
            raise FatalError(
                f"{out} was written with different settings ({'; '.join(diffs)}): "
                "re-run with the same options to resume, --overwrite to start afresh, or another OUTPUT"
            )

    def _load_engine(self, rows_done: int) -> Any:
        from batchgen import LLM

        if not (sys.stderr.isatty() if self.opts.progress_bar is None else self.opts.progress_bar):
            quiet_transformers_bars()
        self.engine_called = time.time()  # imports, reading the input's head, resume checks: before
        try:
            return LLM(config=engine_options(self.opts, self.reader, rows_done))
        except Interrupt:
            raise
        except Exception as exc:
            raise FatalError(f"cannot load model {self.fingerprint['model']!r}: {one_line(exc)}") from exc

    # -- generation ------------------------------------------------------------------------------------
    def _generate(self, llm: Any, writer: Writer, done: DoneSet, totals: Counters, state: RunState) -> int:
        progress = Progress(
            totals, total_rows(self.opts, self.reader), self.opts.log_every, self.opts.progress_bar
        )
        turns = llm.host_turns()
        sink, preparer = self._start_threads(llm, writer, done, state, progress, turns)
        feed = Feed(
            preparer, self.signals, self.stop, self.faults, lambda: preparer.error or sink.error, turns
        )
        feed.snapshot = llm.snapshot  # what the 'submit' fault point reports
        failure: BaseException | None = None
        try:
            # The engine thread gets the GIL back within one short switch interval, and on a GPU the helper
            # threads work while it waits for the device (threads.py); no collection walks the model's and the
            # libraries' objects again (gc_policy.py).
            generating = turns.generating() if turns is not None else nullcontext()
            with engine_switching(), frozen_heap(self.gc_pauses), generating:
                self._drive(llm, feed, sink, turns)
        except Exception as exc:
            failure = exc
        self.stop.set()
        preparer.join(timeout=10)  # a daemon: never let a stuck reader hold the exit
        failure = failure or preparer.error or sink.error
        complete = failure is None and feed.ended and preparer.reached_end and not self.signals.abandon
        complete = complete and not llm.stats.dropped  # a drain left queued rows for the resume
        if complete:
            state.exhausted = self.reader.at_eof
            progress.set_total_rows(self.reader.end_index - self.opts.row_start)
            sink.expect(range(self.opts.row_start, self.reader.end_index), resume_advice(self.opts.input))
        sink.close(complete)
        progress.close()
        code = self._report(progress, llm, complete, failure or sink.error)
        if code == EXIT_OK:
            check_outcome(state, self.opts.max_error_rate)  # every record is written and the state saved
        return code

    def _start_threads(
        self, llm: Any, writer: Writer, done: DoneSet, state: RunState, progress: Progress,
        turns: HostTurns | None,
    ) -> tuple[Sink, Preparer]:  # fmt: skip
        """The writer and the preparer, with the tokenizer shared when its calls only read it (else each
        its own copy: ``model/tokenize.tokenizer_for_thread``)."""
        opts = self.opts
        self.parser = self._reasoning_parser(llm)
        record_opts = RecordOptions(opts.return_tokens, opts.logprobs, opts.on_error, opts.batch_api,
                                    reasoning=self.parser is not None)  # fmt: skip
        tokenizer = tokenizer_for_thread(llm.tokenizer)
        sink = Sink(writer, opts.output, done, state, progress, tokenizer, record_opts, opts.flush_every,
                    self.stop, self.faults, self.signals.log_notices, turns)  # fmt: skip
        queue_size = max(64, 2 * llm.config.max_num_seqs)
        settings = self._prompt_settings(llm)
        llm.prepare(settings.base)  # tensor parallelism: the CUDA graphs of the run's sampling variant
        self.ready = time.time()
        log.info(startup_text(startup_summary(self.started, self.engine_called, self.ready, llm)))
        preparer = Preparer(self.rows, settings, tokenizer_for_thread(llm.tokenizer), done, sink.put,
                            self.stop, queue_size, llm.grammars, turns)  # fmt: skip
        sink.start()
        preparer.start()
        return sink, preparer

    def _drive(self, llm: Any, feed: Feed, sink: Sink, turns: HostTurns | None) -> None:
        """The engine loop. Interrupt (second SIGINT, drain timeout) abandons in-flight rows."""
        stream = llm.stream(feed, detokenize=False, turns=turns)
        signals = self.signals
        signals.on_drain = llm.drain  # queued rows that have not started are left for the resume
        if signals.draining.is_set():
            llm.drain()
        try:
            while not signals.abandon:
                signals.interruptible = True
                try:
                    out = next(stream)
                except StopIteration:
                    return
                finally:
                    signals.interruptible = False
                self.faults.hit("output", llm.snapshot)
                sink.put(out)
                if sink.error is not None:  # e.g. --on-error fail: abandon, do not drain
                    return
        except Interrupt:
            signals.abandon = True
        finally:
            stream.close()

    def _prompt_settings(self, llm: Any) -> PromptSettings:
        opts = self.opts
        return PromptSettings(
            BatchRequests() if opts.batch_api else opts.spec, opts.base_sampling(llm.default_sampling),
            opts.chat, opts.system_prompt,
            int(llm.max_model_len), opts.on_error == "fail", opts.chat_template, opts.chat_template_kwargs,
            reasoning=self.parser,
        )  # fmt: skip

    def _reasoning_parser(self, llm: Any) -> ReasoningParser | None:
        """The run's reasoning parser on the loaded tokenizer (which one was fixed before it loaded)."""
        try:
            return parser_for(self.opts.reasoning, llm.tokenizer)
        except ValueError as exc:
            raise FatalError(str(exc)) from None

    # -- the end ---------------------------------------------------------------------------------------
    def _report(self, progress: Progress, llm: Any, complete: bool, failure: BaseException | None) -> int:
        self.signals.log_notices()
        status = "failed" if failure else "complete" if complete else "interrupted"
        summary = progress.summary(status, getattr(llm, "stats", None))
        summary["startup"] = startup_summary(self.started, self.engine_called, self.ready or time.time(), llm)
        summary["max_num_seqs"] = getattr(getattr(llm, "config", None), "max_num_seqs", None)
        summary["gc"] = self.gc_pauses.summary()  # the collector's pauses while generating (gc_policy.py)
        log.info(summary_text(summary))
        self._write_stats(summary)
        if failure is not None:
            if rank_lost(failure) and self.signals.draining.is_set():
                log.info(
                    "%s after a stop signal: saved; re-run the same command to resume (exit 75)", failure
                )
                return EXIT_INTERRUPTED
            if isinstance(failure, FatalError | SchemaError):
                raise failure
            raise as_fatal(failure) from failure
        if not complete:
            log.info("saved; %s (exit 75)", resume_advice(self.opts.input))
            return EXIT_INTERRUPTED
        return EXIT_OK

    def _write_stats(self, summary: dict[str, Any]) -> None:
        if not self.opts.stats_file:
            return
        try:
            Path(self.opts.stats_file).write_text(json.dumps(summary, indent=2) + "\n")
        except OSError as exc:  # e.g. the same full disk: the run's own outcome matters more
            log.warning("could not write the stats file %s: %s", self.opts.stats_file, exc)
