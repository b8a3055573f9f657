"""Keep freed memory in the process on the CPU path: glibc's malloc otherwise maps and unmaps it per op.

A CPU forward allocates every intermediate anew: gathered K/V blocks, projection outputs, a prefill's
[T, 2I] activations, each megabytes in size. glibc serves blocks above its mmap threshold (raised on the
fly up to a cap) with fresh ``mmap`` pages and returns freed heap tops above its trim threshold to the
kernel, so the next step page-faults all of it in again, paid as system time (docs/results.md, "Figures
behind code choices", counts it on B4).

``keep_freed_memory`` raises both thresholds (``mallopt``) to 64 MiB once a run knows it computes on the
CPU, which removes most of those page faults. Much higher thresholds never returned the heap's unused
top, so RSS crept over a long run (``tests/app/test_run_memory.py`` bounds that growth).
Skipped when the C library is not glibc, when ``MALLOC_*`` variables or ``LD_PRELOAD`` (jemalloc,
tcmalloc) show the user chose the allocator's policy, and with ``BATCHGEN_KEEP_FREED_MEMORY=0``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameter numbers
_THRESHOLD = 64 << 20  # a forward's intermediates stay on the heap; at most this much kept unused on top


def user_chose_allocator(environ: os._Environ | dict[str, str] = os.environ) -> bool:
    return (
        environ.get("BATCHGEN_KEEP_FREED_MEMORY") == "0"
        or "LD_PRELOAD" in environ
        or any(key.startswith("MALLOC_") for key in environ)
    )


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process; True when they were set."""
    if user_chose_allocator():
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        if not hasattr(libc, "gnu_get_libc_version"):  # musl, macOS: their malloc has no such knobs
            return False
        done = (
            libc.mallopt(_M_MMAP_THRESHOLD, _THRESHOLD) == 1
            and libc.mallopt(_M_TRIM_THRESHOLD, _THRESHOLD) == 1
        )
    except (OSError, AttributeError):
        return False
    log.debug("glibc malloc: freed memory stays in the process (mmap / trim thresholds %d)", _THRESHOLD)
    return done
