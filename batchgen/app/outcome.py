"""A finished run's verdict: exit 1 when every row failed, or more than ``--max-error-rate`` of them.

Judged on the output's saved state once every record is written, so a re-run of a finished output (which
redoes nothing) and a merged data-parallel output give the same verdict as the run that wrote them.
"""

from __future__ import annotations

from batchgen.app.error_kinds import ErrorKinds
from batchgen.app.errors import FatalError
from batchgen.io.checkpoint import RunState


class RunFailed(FatalError):
    """The run ended and its records are saved, but too many of its rows failed."""


def failure_verdict(state: RunState, max_error_rate: float = 1.0) -> str | None:
    """The one line that fails a finished run, or None when it succeeded."""
    rows = state.rows_done + state.skipped  # every row that got its records, or was dropped
    if not rows:
        return None
    if state.errors == state.records:  # every record an error (none at all: every row skipped)
        return f"all {_rows(rows)} failed{commonest_text(state.error_counts)}"
    failed = state.failed_rows
    if failed / rows > max_error_rate:
        share = f"{100 * failed / rows:.1f}%, more than --max-error-rate {max_error_rate:g}"
        return f"{failed} of {_rows(rows)} failed ({share}){commonest_text(state.error_counts)}"
    return None


def check_outcome(state: RunState, max_error_rate: float = 1.0) -> None:
    """Raise ``RunFailed`` (exit 1, one line) when the finished run in ``state`` failed."""
    verdict = failure_verdict(state, max_error_rate)
    if verdict is not None:
        raise RunFailed(verdict)


def commonest_text(error_counts: dict[str, int]) -> str:
    """``; commonest error (9 rows): MESSAGE`` from a state's error counts ("" when it has none)."""
    found = ErrorKinds(error_counts).commonest()
    return "" if found is None else f"; commonest error ({_rows(found[1])}): {found[0]}"


def _rows(count: int) -> str:
    return f"{count} row" if count == 1 else f"{count} rows"
