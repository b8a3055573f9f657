"""Triton's once-a-process costs, paid beside the model's load instead of in the first step.

The first Triton launch of a process computes Triton's cache key (``triton.runtime.cache.triton_key``:
a sha256 over its large shared library and its sources) and imports its gluon front end. Both sat in
B7's first eager step, most of its time, until they were done beforehand (docs/results.md). Reading and
hashing the library let go of the GIL, so a thread started before the weights load hides most of it. The
caller joins the thread before the first launch, so no launch races it; while the model loads, imports on both
threads are safe (each module has its own import lock) and the main thread imports ``triton.language`` before
the thread starts.

A run with an FP8 KV cache also compiles the CUDA decode attention there (``fp8_decode_cuda``: NVRTC and
the module load, once for each of its two builds: cp.async and TMA), which its first decode step
paid otherwise.
"""

from __future__ import annotations

import threading


def _warm(fp8_attention: tuple[int, bool] | None) -> None:
    try:
        from triton.runtime.cache import triton_key

        triton_key()  # cached for the process (functools.lru_cache)
        import triton.experimental.gluon  # noqa: F401
    except Exception:  # best effort (another Triton, an import race): the first launch pays what is left
        pass
    if fp8_attention is not None:
        from batchgen.kernels.attention import fp8_decode_cuda

        fp8_decode_cuda.prepare(*fp8_attention)  # best effort: a failure is logged, the first step retries


def start(fp8_attention: tuple[int, bool] | None = None) -> threading.Thread:
    """Start computing Triton's per-process state; ``join`` the thread before the first launch.
    ``fp8_attention``: (device index, query in bf16) of a run with an FP8 KV cache."""
    import triton.language  # noqa: F401  (here, on the caller's thread: the worker only adds to it)

    thread = threading.Thread(target=_warm, args=(fp8_attention,), name="batchgen-triton-warmup", daemon=True)
    thread.start()
    return thread
