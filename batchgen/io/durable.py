"""Making bytes durable, and saying which file failed when that goes wrong.

A write or an fsync on an open file raises an OSError that names no file; ``naming`` adds the path, so a
full disk, an exceeded quota, an I/O error or a vanished directory is reported as one line that says
where. ``remove_quietly`` drops the temporary file of a failed write: it holds no record anyone needs,
and on a full disk its space is what the next step lacks.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

Opener = Callable[..., Any]  # open(), or Faults.open under a fault injection


@contextmanager
def naming(path: str | os.PathLike) -> Iterator[None]:
    """Re-raise an OSError that names no file as the same error (same errno, same subclass) naming
    ``path``."""
    try:
        yield
    except OSError as exc:
        if exc.filename is not None or exc.errno is None:
            raise
        raise OSError(exc.errno, exc.strerror or os.strerror(exc.errno), os.fspath(path)) from exc


def remove_quietly(path: str | os.PathLike) -> None:
    with suppress(OSError):
        os.unlink(path)


def fsync_dir(path: str | os.PathLike) -> None:
    """A rename is durable only once its directory is synced."""
    fd = os.open(path, os.O_RDONLY)
    try:
        with naming(path):
            os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike, data: bytes, opener: Opener = open) -> None:
    """tmp + fsync + rename + fsync(dir): after a crash the file holds the old or the new bytes; after a
    failed write, too (the tmp is removed)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with naming(tmp), opener(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except OSError:
        remove_quietly(tmp)
        raise
    os.replace(tmp, path)
    fsync_dir(path.parent)
