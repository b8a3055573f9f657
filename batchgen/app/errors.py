"""Failures the CLI reports as one clear line with exit 1 (no traceback unless -v)."""

from __future__ import annotations

import errno


class FatalError(RuntimeError):
    """An expected failure with a message meant for the user."""


class RowFailed(FatalError):
    """--on-error fail: the first bad row stops the run."""


def storage_failure(exc: OSError) -> FatalError:
    """A failed read or write (a full disk, a quota, an I/O error, a vanished directory) as one line: the
    file, the error, what to do. Records saved before it are durable and a re-run resumes after them."""
    name = errno.errorcode.get(exc.errno or 0)
    what = f"{exc.strerror or exc}" + (f" ({name})" if name else "")
    where = f" on {exc.filename}" if exc.filename else ""
    todo = "free some space, then re-run" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else "re-run"
    return FatalError(f"I/O error{where}: {what}; {todo} the same command to resume (what was saved is kept)")


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def rank_lost(exc: BaseException) -> bool:
    """A tensor-parallel rank died: RankFailed from rank 0's waits, or gloo's error in a collective."""
    from batchgen.parallel.launch import RankFailed

    return isinstance(exc, RankFailed) or (
        isinstance(exc, RuntimeError) and "Connection closed by peer" in str(exc)
    )


def as_fatal(exc: BaseException) -> FatalError:
    """An unexpected failure of the run as the one line the CLI prints."""
    if rank_lost(exc):
        return FatalError(" ".join(str(exc).split()))
    if isinstance(exc, OSError):
        return storage_failure(exc)
    return FatalError(one_line(exc))
