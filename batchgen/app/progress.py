"""Counters, the progress display (a tqdm bar on a terminal, log lines otherwise) and the final summary."""

from __future__ import annotations

import logging
import os
import resource
import sys
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from batchgen.app.error_kinds import ErrorKinds
from batchgen.io.checkpoint import DoneSet

log = logging.getLogger("batchgen")


@dataclass
class Counters:
    rows_done: int = 0  # rows with every sample written
    records: int = 0
    errors: int = 0
    skipped: int = 0  # bad rows dropped by --on-error skip
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reasons: Counter = field(default_factory=Counter)
    failed_rows: int = 0  # rows with an error record, or skipped
    error_kinds: ErrorKinds = field(default_factory=ErrorKinds)  # failed rows by error
    # which rows failed, so that a row counts once however many of its samples failed; copies share it
    # (a revert to the last flush happens only as the run stops)
    failed: DoneSet = field(default_factory=lambda: DoneSet(1), repr=False)

    def add_record(self, finish_reason: str, prompt_tokens: int, completion_tokens: int) -> None:
        self.records += 1
        self.errors += finish_reason == "error"
        self.prompt_tokens += prompt_tokens or 0
        self.completion_tokens += completion_tokens or 0
        self.finish_reasons[finish_reason] += 1

    def add_scanned(self, record: dict[str, Any]) -> None:
        """A record a resumed run found in the output (its scan fields: ``io/writers.SCAN_FIELDS``)."""
        self.add_record(record["finish_reason"], record["prompt_tokens"], record["completion_tokens"])
        if record["finish_reason"] == "error":
            self.add_failure(record["index"], record.get("error"))

    def add_failure(self, index: int, error: str | None) -> None:
        """Row ``index`` failed (an error record, or skipped) with ``error``."""
        if self.failed.add(index, 0):
            self.failed_rows += 1
            self.error_kinds.add(error or "engine error")

    def copy(self) -> Counters:
        return replace(self, finish_reasons=Counter(self.finish_reasons), error_kinds=self.error_kinds.copy())


def format_duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


class Progress:
    """This run's counters (``run``) next to the output's totals (``total``), shown as the run goes.

    Only the writer thread calls ``record``/``tick``/``mark_durable``; the main thread reads the counters
    at the end. After a failed write, ``revert_to_durable`` takes the counters back to the last flush, so
    the summary and the state count only records the output durably holds.
    """

    def __init__(
        self,
        total: Counters,
        total_rows: int | None,
        log_every: float,
        bar: bool | None = None,
    ) -> None:
        self.total = total
        self.run = Counters()
        self.total_rows = total_rows
        self.log_every = log_every
        self.start = time.monotonic()
        self.end: float | None = None  # set by stop_clock: the summary and the state share one rate
        self._last_log = self.start
        use_bar = sys.stderr.isatty() if bar is None else bar
        self._bar = self._make_bar() if use_bar else None
        self.mark_durable()  # what a resumed run found is on disk already

    def _make_bar(self):
        from tqdm import tqdm

        return tqdm(
            total=self.total_rows,
            initial=self.total.rows_done,
            unit="row",
            desc="batchgen",
            file=sys.stderr,
            dynamic_ncols=True,
            bar_format=_bar_format(self.total_rows),
        )

    @property
    def has_bar(self) -> bool:
        return self._bar is not None

    def set_total_rows(self, rows: int) -> None:
        self.total_rows = rows
        if self._bar is not None:
            self._bar.total = rows
            self._bar.bar_format = _bar_format(rows)
            self._bar.refresh()

    def record(self, finish_reason: str, prompt_tokens: int, completion_tokens: int, row_done: bool) -> None:
        for c in (self.run, self.total):
            c.add_record(finish_reason, prompt_tokens, completion_tokens)
            c.rows_done += row_done
        if self._bar is not None and row_done:
            self._bar.set_postfix_str(f"{self._tokens_text()}, {self.total.errors} err", refresh=False)
            self._bar.update(1)

    def mark_durable(self) -> None:
        self._durable = (self.run.copy(), self.total.copy())

    def revert_to_durable(self) -> None:
        self.run, self.total = self._durable[0].copy(), self._durable[1].copy()

    def failed(self, index: int, error: str | None) -> None:
        """Row ``index`` failed: counted once, by its error, for the run's verdict (app/outcome.py)."""
        for c in (self.run, self.total):
            c.add_failure(index, error)

    def skipped(self, index: int, error: str | None) -> None:
        """--on-error skip dropped row ``index``: no record, but a failed row all the same."""
        for c in (self.run, self.total):
            c.skipped += 1
        self.failed(index, error)

    def stop_clock(self) -> None:
        """The run's generation is over: the rate saved in the state and the summary's are this one."""
        if self.end is None:
            self.end = time.monotonic()

    def elapsed(self) -> float:
        return (self.end if self.end is not None else time.monotonic()) - self.start

    def tok_per_s(self) -> float:
        """The one output rate the bar, the log lines, the summary and ``status`` show: this run's output
        tokens over its time generating (a resumed run's earlier tokens are not this run's work)."""
        return self.run.completion_tokens / max(self.elapsed(), 1e-9)

    def eta_s(self) -> float | None:
        """Seconds left: the output tokens still to come over the rate. Rows differ in length and the
        engine's time goes with tokens, so the tokens to come are the rows left times the mean output
        tokens of a finished row (every sample of it; error rows count, with their 0 tokens)."""
        total, done, rate = self.total_rows, self.total.rows_done, self.tok_per_s()
        if not total or not done or rate <= 0:
            return None
        rows_left = max(total - done - self.run.skipped, 0)
        return rows_left * (self.total.completion_tokens / done) / rate

    def _tokens_text(self) -> str:
        eta = self.eta_s()
        text = f"{self.run.completion_tokens} tokens out, {self.tok_per_s():.1f} tok/s"
        return text if eta is None else f"{text}, ETA {format_duration(eta)}"

    def tick(self) -> None:
        """A plain log line every ``log_every`` seconds when there is no bar (Slurm logs)."""
        now = time.monotonic()
        if self._bar is None and now - self._last_log >= self.log_every:
            self._last_log = now
            log.info(self.line())

    def line(self) -> str:
        done, total = self.total.rows_done, self.total_rows
        rows = f"{done}/{total} rows ({100 * done / total:.1f}%)" if total else f"{done} rows"
        return f"{rows}, {self.total.errors} errors, {self._tokens_text()}"

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def summary(self, status: str, engine_stats: Any = None) -> dict[str, Any]:
        wall = self.elapsed()
        return {
            "status": status,
            "rows": self.run.rows_done,
            "records": self.run.records,
            "errors": self.run.errors,
            "skipped": self.run.skipped,
            "prompt_tokens": self.run.prompt_tokens,
            "completion_tokens": self.run.completion_tokens,
            "wall_s": round(wall, 3),
            "tokens_per_s": round(self.tok_per_s(), 2),
            "finish_reasons": dict(self.run.finish_reasons),
            "rows_done_total": self.total.rows_done,
            "total_rows": self.total_rows,
            "peak_rss_mb": round(peak_rss_mb(), 1),
            "engine": _plain(engine_stats),
        }


def _bar_format(total_rows: int | None) -> str:
    """Rows done, then this run's output tokens, rate and token-based ETA (the postfix)."""
    if total_rows is None:
        return "{desc}: {n_fmt} rows [{elapsed}{postfix}]"
    return "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} rows [{elapsed}{postfix}]"


def summary_text(s: dict[str, Any]) -> str:
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(s["finish_reasons"].items())) or "none"
    total = f" (output now {s['rows_done_total']}/{s['total_rows']} rows)" if s["total_rows"] else ""
    skipped = f", {s['skipped']} skipped" if s["skipped"] else ""
    return (
        f"{s['status']}: {s['rows']} rows, {s['records']} records, {s['errors']} errors{skipped}{total}; "
        f"tokens {s['prompt_tokens']} in / {s['completion_tokens']} out; wall {s['wall_s']:.1f} s, "
        f"{s['tokens_per_s']:.1f} tok/s; finish reasons: {reasons}{_speculation_text(s.get('engine'))}"
    )


def _speculation_text(engine: Any) -> str:
    """The guesses verified and accepted, when the run speculated (engine/speculative)."""
    if not isinstance(engine, dict) or not engine.get("verify_steps"):
        return ""
    return (
        f"; speculation: {engine['accepted_tokens']} of {engine['draft_tokens']} guessed tokens accepted "
        f"({100 * engine['acceptance_rate']:.0f} %), {engine['accepted_per_verify_step']:.2f} a verify step "
        f"in {engine['verify_steps']} of {engine['steps']} steps"
    )


def _plain(stats: Any) -> Any:
    """Engine stats as JSON-able data, whatever shape the engine gives them."""
    if stats is None or isinstance(stats, (int, float, str, bool)):
        return stats
    if isinstance(stats, dict):
        return {str(k): _plain(v) for k, v in stats.items()}
    if isinstance(stats, (list, tuple)):
        return [_plain(v) for v in stats]
    if hasattr(stats, "_asdict"):
        return _plain(stats._asdict())
    if hasattr(stats, "__dataclass_fields__"):
        return _plain({k: getattr(stats, k) for k in stats.__dataclass_fields__})
    if hasattr(stats, "__dict__"):
        return _plain({k: v for k, v in vars(stats).items() if not k.startswith("_")})
    return str(stats)


def quiet_transformers_bars() -> None:
    """Carriage-return bars garble log files: transformers' own (loading weights) too, if it loads any.
    A run of a model read from its files (model/files/) never imports transformers: do not import it
    here either; huggingface_hub reads the variable when transformers first imports it."""
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    else:
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
