"""How many rows decode together when ``--max-num-seqs`` is not given.

A decode step reads every weight once, whatever the number of rows, so a wider batch spends fewer weight
reads per generated token: a large model (a mixture of experts above all, whose experts are most of its
bytes) gains most. The width is bounded by

- the KV cache: rows the pool holds at ``ROW_TOKENS`` tokens each. A row holds its prompt at first and
  grows as it decodes, so rows in flight hold about prompt + half their completion on average; one that
  outgrows its share is not refused: the scheduler preempts the newest rows when the pool runs out and
  recomputes them later, as for an explicit width. A width sized for whole 1024-token rows ran a
  mixture of experts on a small pool slower than a wider one that preempted (docs/results.md, "Batch
  width");
- ``cap`` (``EngineConfig.max_num_seqs_cap``): the host prepares every step's rows and reads back their
  tokens; past some width it cannot keep up with a small model's steps (docs/results.md, "Batch width").

On the CPU every step is compute-bound: a wider batch gains nothing, and the pool is sized by need, so
the fixed ``CPU_WIDTH`` stands.

Pure Python: the caller measures the pool.
"""

from __future__ import annotations

ROW_TOKENS = 512  # a row's mean KV footprint in flight, when the width is chosen
CPU_WIDTH = 256


def auto_width(kv_tokens: int, cap: int, on_gpu: bool) -> int:
    """Rows that decode together: those ``kv_tokens`` of cache hold at ``ROW_TOKENS`` each (at least one),
    at most ``cap``; ``CPU_WIDTH`` (at most ``cap``) off the GPU."""
    if not on_gpu:
        return min(cap, CPU_WIDTH)
    return max(1, min(cap, kv_tokens // ROW_TOKENS))


def width_for(requested: int | None, kv_tokens: int, cap: int, on_gpu: bool) -> int:
    """The width a run uses: the one asked for, else ``auto_width``."""
    return requested if requested is not None else auto_width(kv_tokens, cap, on_gpu)


def rows_in_budget(budget: int, kv_row_bytes: int, logit_row_bytes: int, cap: int) -> int:
    """Rows a device's free ``budget`` holds when each takes ``ROW_TOKENS`` of KV (``kv_row_bytes``) and
    room for its logits: at least one, at most ``cap``."""
    return max(1, min(cap, budget // (kv_row_bytes + logit_row_bytes)))


def pool_width(requested: int | None, cap: int, on_gpu: bool) -> int:
    """The rows the KV pool is sized for before the width is known (the pool's need is rows x the model
    length): the width asked for, else the most ``auto_width`` can pick."""
    if requested is not None:
        return requested
    return min(cap, CPU_WIDTH) if not on_gpu else cap
