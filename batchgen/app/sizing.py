"""How much a run has left to do, when cheap to know: its rows (for progress) and its requests (to size
the engine's batches)."""

from __future__ import annotations

import logging
from dataclasses import replace

from batchgen.app.options import RunOptions
from batchgen.config import EngineConfig
from batchgen.io.readers import Reader

log = logging.getLogger("batchgen")


def total_rows(opts: RunOptions, reader: Reader) -> int | None:
    """Rows this run covers, when cheap to know (corrected once the input is read to its end)."""
    is_parquet = reader.schema_columns() is not None
    if opts.limit is not None and not is_parquet:
        return opts.limit  # no need to count a huge JSONL file to run its first rows
    count = reader.count_rows()
    total = None if count is None else max(0, count - opts.row_start)
    if opts.limit is not None:
        total = opts.limit if total is None else min(total, opts.limit)
    return total


def requests_left(opts: RunOptions, reader: Reader, rows_done: int, cap: int) -> int | None:
    """Requests (rows x samples) the run has left when fewer than ``cap`` and cheap to know (reads at most
    the line starts up to there, or the Parquet footers); else None."""
    want = opts.row_start + rows_done + cap  # more rows than this: ``cap`` stands
    count = reader.count_rows(at_most=want)
    if count is None or count >= want:
        return None
    rows = count - opts.row_start
    if opts.limit is not None:
        rows = min(rows, opts.limit)
    return max(0, rows - rows_done) * opts.n


def engine_options(opts: RunOptions, reader: Reader, rows_done: int) -> EngineConfig:
    """The engine's options. A run with fewer requests left than the width it could batch (--max-num-seqs,
    else the automatic width's cap) batches at most those: larger decode buckets could never run, and
    their CUDA graphs cost start-up time."""
    engine = opts.engine
    cap = engine.max_num_seqs or engine.max_num_seqs_cap
    left = requests_left(opts, reader, rows_done, cap)
    if left is None or left >= cap:
        return engine
    log.info("%d requests to generate: batching at most %d at a time", left, max(1, left))
    if engine.max_num_seqs is None:  # still chosen from the KV cache, now up to the requests left
        return replace(engine, max_num_seqs_cap=max(1, left))
    return replace(engine, max_num_seqs=max(1, left))
