"""Failures the CLI reports as one clear line with exit 1 (no traceback unless -v)."""

from __future__ import annotations

import errno


class FatalError(RuntimeError):
    """An expected failure with a message meant for the user."""


class RowFailed(FatalError):
    """--on-error fail: the first bad row stops the run."""


# Errors a re-run of the same command meets again: the path or its permissions must change first.
_PERMANENT = {errno.EISDIR, errno.ENOTDIR, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENAMETOOLONG,
              errno.ELOOP, errno.EFBIG}  # fmt: skip


def storage_failure(exc: OSError) -> FatalError:
    """A failed read or write (a full disk, a quota, an I/O error, a vanished directory) as one line: the
    file, the error, what to do. Records saved before it are durable and a re-run resumes after them; the
    advice to re-run is given only where a re-run can get past the error."""
    name = errno.errorcode.get(exc.errno or 0)
    what = f"{exc.strerror or exc}" + (f" ({name})" if name else "")
    where = f" on {exc.filename}" if exc.filename else ""
    return FatalError(f"I/O error{where}: {what}; {_todo(exc.errno)} (what was saved is kept)")


def _todo(code: int | None) -> str:
    if code in _PERMANENT:
        return "a re-run meets it again: fix the path or its permissions first"
    if code in (errno.ENOSPC, errno.EDQUOT):
        return "free some space, then re-run the same command to resume"
    return "re-run the same command to resume"


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def rank_lost(exc: BaseException) -> bool:
    """A tensor-parallel rank died: RankFailed from rank 0's waits, or gloo's error in a collective."""
    from batchgen.tensor_parallel.launch import RankFailed

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
