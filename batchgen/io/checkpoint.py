"""Resume state: the done set of (index, sample), the run's fingerprint, and the small state file.

The output itself is the source of truth for what is done (a record exists = that (row, sample) is done);
the state file, beside it in ``OUTPUT.batchgen/``, holds what the output cannot: the fingerprint that
refuses a mismatched re-run, whether the run finished, and the last counts and rate for ``status``.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from batchgen.io.durable import Opener, write_atomic

STATE_VERSION = 1


# -- file layout -----------------------------------------------------------------------------------------
def sidecar_dir(output: str | os.PathLike) -> Path:
    """``out.jsonl`` -> ``out.jsonl.batchgen/``: state file, lock, Parquet parts."""
    return Path(str(output) + ".batchgen")


def state_path(output: str | os.PathLike) -> Path:
    return sidecar_dir(output) / "state.json"


# -- done set --------------------------------------------------------------------------------------------
class DoneSet:
    """A bitmap over ``index * n + sample`` for the run's ``n`` samples a row: 2 million rows cost 250 KB.
    Rows that ask for more samples (a per-row ``n``) keep the extra ones in a small dict.

    One thread adds; others may read. ``bytearray.extend`` grows in place, so readers never see a stale
    buffer, and a single byte read or write is atomic under the GIL.
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self._bits = bytearray()
        self._extra: dict[int, set[int]] = {}  # index -> its done samples >= n
        self.count = 0  # records

    def _grow(self, nbytes: int) -> None:
        if nbytes > len(self._bits):
            self._bits.extend(bytes(max(nbytes - len(self._bits), len(self._bits))))

    def add(self, index: int, sample: int) -> bool:
        """Mark (index, sample) done; False when it already was (a duplicate)."""
        if self.has(index, sample):
            return False
        if sample >= self.n:
            self._extra.setdefault(index, set()).add(sample)
        else:
            byte, bit = divmod(index * self.n + sample, 8)
            self._grow(byte + 1)
            self._bits[byte] |= 1 << bit
        self.count += 1
        return True

    def has(self, index: int, sample: int) -> bool:
        if sample >= self.n:
            return sample in self._extra.get(index, ())
        byte, bit = divmod(index * self.n + sample, 8)
        return byte < len(self._bits) and bool(self._bits[byte] >> bit & 1)

    def missing(self, index: int, n: int | None = None) -> tuple[int, ...]:
        """The samples of row ``index`` not done, of its ``n`` (default: the run's)."""
        return tuple(s for s in range(self.n if n is None else n) if not self.has(index, s))

    def row_done(self, index: int, n: int | None = None) -> bool:
        return not self.missing(index, n)

    def range_done(self, start: int, stop: int) -> bool:
        """All of the run's samples of rows start..stop done (a whole Parquet row group can be skipped)."""
        lo, hi = start * self.n, stop * self.n
        if hi <= lo:
            return True
        if (hi + 7) // 8 > len(self._bits):
            return False
        full_lo, full_hi = (lo + 7) // 8, hi // 8
        if full_lo < full_hi and self._bits.count(0xFF, full_lo, full_hi) != full_hi - full_lo:
            return False  # ... the ranged count of whole bytes is C-fast; edges are checked bit by bit
        edges = list(range(lo, min(hi, full_lo * 8))) + list(range(max(lo, full_hi * 8), hi))
        return all(self._bits[k // 8] >> (k % 8) & 1 for k in edges)

    def rows_done(self) -> int:
        """Rows with every one of the run's samples done (for progress after a resume)."""
        if self.n == 1:
            return self.count - sum(len(s) for s in self._extra.values())
        rows = (len(self._bits) * 8) // self.n
        return sum(1 for i in range(rows) if self.row_done(i))


# -- fingerprint -----------------------------------------------------------------------------------------
def diff_fingerprints(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Human-readable differences, e.g. ``temperature: 0.0 -> 0.7``."""
    diffs = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            diffs += [f"{key} {d}" for d in diff_fingerprints(a, b)]
        elif a != b:
            diffs.append(f"{key}: {_show(a)} -> {_show(b)}")
    return diffs


def _show(value: Any) -> str:
    return "(unset)" if value is None else json.dumps(value) if not isinstance(value, str) else repr(value)


# -- state file ------------------------------------------------------------------------------------------
@dataclass
class RunState:
    fingerprint: dict[str, Any]
    n: int = 1
    # A row asked for another number of samples than ``n``: a resume must read every row (the done set
    # alone cannot tell such a row's missing samples). Saved before any record of such a row is written.
    varied_n: bool = False
    total_rows: int | None = None  # rows this run covers (input rows, capped by --limit), when known
    exhausted: bool = False  # the input was read to its end
    complete: bool = False
    rows_done: int = 0
    records: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reasons: dict[str, int] = field(default_factory=dict)
    failed_rows: int = 0  # rows with an error record, or skipped by --on-error skip
    skipped: int = 0  # rows --on-error skip wrote nothing for (a resume redoes them: the last run's)
    error_counts: dict[str, int] = field(default_factory=dict)  # failed rows by error (app/error_kinds.py)
    rate_tok_s: float = 0.0  # output tokens/s of the last run: its tokens over its time generating
    started: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    version: int = STATE_VERSION

    def covers(self, limit: int | None) -> bool:
        """A complete run also covers a re-run that asks for no more rows than it did."""
        if not self.complete:
            return False
        return self.exhausted or (
            limit is not None and self.total_rows is not None and limit <= self.total_rows
        )


def load_state(output: str | os.PathLike) -> RunState | None:
    path = state_path(output)
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"cannot read the state file {path}: {exc}") from None
    known = RunState.__dataclass_fields__
    return RunState(**{k: v for k, v in data.items() if k in known})


def save_state(output: str | os.PathLike, state: RunState, opener: Opener = open) -> None:
    state.updated = time.time()
    write_atomic(state_path(output), json.dumps(asdict(state), indent=1).encode(), opener)


# -- one writer per output -------------------------------------------------------------------------------
class OutputLock:
    """An exclusive flock on ``OUTPUT.batchgen/lock``: two runs appending to one output would duplicate."""

    def __init__(self, output: str | os.PathLike) -> None:
        self.path = sidecar_dir(output) / "lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise RuntimeError(f"another batchgen run ({holder}) is writing this output") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None


def is_locked(output: str | os.PathLike) -> bool:
    """True while a run holds the output (for ``status``)."""
    path = sidecar_dir(output) / "lock"
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
