"""Scheduled step -> packed host arrays (numpy): tokens, positions, KV slots, block tables, sampling rows.

No padding inside a step: the new tokens of all sequences are packed into T rows. A decode whose input
token is still being sampled by the previous (in-flight) step gets a placeholder and a carry-over row:
the runner patches it in on the device from the previous step's output.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from batchgen.engine.rows import RowState
from batchgen.engine.scheduler import ScheduledStep


class StepInputs(NamedTuple):
    step_id: int
    input_ids: np.ndarray  # [T] int64 (0 where carried over)
    carry_rows: np.ndarray  # [T] int64: row of the previous step's sampled tokens, -1 = none
    positions: np.ndarray  # [T] int64
    slot_mapping: np.ndarray  # [T] int64
    cu_seqlens_q: np.ndarray  # [B + 1] int32
    seq_lens: np.ndarray  # [B] int32, context length after this step
    block_tables: np.ndarray  # [B, max_blocks] int32 (0-padded)
    logits_indices: np.ndarray  # [S] int64: rows whose logits are sampled
    temperature: np.ndarray  # [S] float32
    top_p: np.ndarray  # [S] float32
    top_k: np.ndarray  # [S] int64 (0 = off)
    rng_keys: np.ndarray  # [S] int64: per-(row, sample) key
    rng_steps: np.ndarray  # [S] int64: index of the output token being sampled
    any_sampling: bool  # some row is not greedy
    want_logprobs: bool
    max_q_len: int
    max_seq_len: int
    # Some sampled row is constrained (structured output): the runner computes the logits, and samples
    # once the engine has filled the step's token masks (``runner.sample``).
    masked: bool = False

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def decode_only(self) -> bool:
        return self.max_q_len == 1


def build_step(step: ScheduledStep, block_size: int, rows: RowState) -> StepInputs:
    """Gather the step's rows of the persistent batch: the decodes' inputs with array operations over
    their rows, the prefill chunks' one by one."""
    scan = _concat(_scan_decodes(step, rows), _scan_items(step, len(step.decodes.requests)))
    num_seqs, counts = step.num_seqs, scan.counts
    seq_lens = scan.starts + counts
    max_seq_len = int(seq_lens.max())
    cu = np.zeros(num_seqs + 1, np.int32)
    np.cumsum(counts, out=cu[1:])
    total = int(cu[-1])
    if total == num_seqs:  # decode only: one token per sequence
        seq_of_row, positions = np.arange(total), scan.starts
    else:
        seq_of_row = np.repeat(np.arange(num_seqs), counts)  # [T]
        positions = scan.starts[seq_of_row] + (np.arange(total) - cu[:-1][seq_of_row])
    tables = rows.tables[scan.rows, : -(-max_seq_len // block_size)]  # [B, W] (a copy)
    blocks = tables[seq_of_row, positions // block_size]
    *sampling, masked = _sampling_rows(rows, scan.rows[scan.sampled], cu, scan)
    return StepInputs(
        step.step_id,
        scan.ids,
        scan.carry_rows,
        positions,
        blocks.astype(np.int64) * block_size + positions % block_size,
        cu,
        seq_lens.astype(np.int32),
        tables,
        *sampling,
        max_q_len=int(counts.max()),
        max_seq_len=max_seq_len,
        masked=masked,
    )


class _Scan(NamedTuple):
    """The step's sequences as arrays (int64 each)."""

    starts: np.ndarray  # [B] first position each computes
    counts: np.ndarray  # [B] tokens each computes
    rows: np.ndarray  # [B] each one's row of the persistent batch
    ids: np.ndarray  # [T] input tokens, 0 where carried over
    carry_rows: np.ndarray  # [T] row of the previous step's sampled tokens holding the input, else -1
    sampled: np.ndarray  # [S] sequences that sample
    rng_steps: np.ndarray  # [S] index of the output token each sampled row draws


def _scan_decodes(step: ScheduledStep, rs: RowState) -> _Scan:
    """The decodes: one token each, sampled. Each input token is known on the host (the synchronous
    loop) or is being sampled by the step before (carried over on the device). Each decode's output
    row is remembered for the next step's carry-over."""
    decodes, step_id = step.decodes, step.step_id
    rows, starts, n = decodes.rows, decodes.starts, len(decodes.rows)
    known = rs.known[rows] > starts  # [D]
    ids = np.zeros(n, np.int64)
    if known.any():
        at = np.flatnonzero(known).tolist()
        ids[at] = [decodes.requests[i].tokens[int(starts[i])] for i in at]
    carry_rows = np.where(known, -1, rs.carry_row[rows])
    stale = ~known & (rs.carry_step[rows] != step_id - 1)
    if stale.any():
        req = decodes.requests[int(np.argmax(stale))]
        raise RuntimeError(f"request {req.request_id}: input token not produced by the last step")
    rs.carry_step[rows] = step_id
    rs.carry_row[rows] = np.arange(n)
    rng_steps = rs.known[rows] + rs.num_pending[rows] - rs.prompt[rows] - 1  # outputs incl. this one
    return _Scan(starts, np.ones(n, np.int64), rows, ids, carry_rows, np.arange(n), rng_steps)


def _scan_items(step: ScheduledStep, first: int) -> _Scan:
    """The prefill chunks (a few a step), one by one; sequence numbers start at ``first``."""
    starts, counts, rows, ids, carry, sampled, rng_steps = [], [], [], [], [], [], []
    step_id = step.step_id
    for i, (req, start, n, samples) in enumerate(step.items, first):
        starts.append(start)
        counts.append(n)
        rows.append(req.row)
        tokens = req.tokens
        known = len(tokens) - start
        if known >= n:
            ids.extend(tokens[start : start + n])
            carry.extend([-1] * n)
        else:  # the one token the previous step is sampling right now: carried over on the device
            if (known if known > 0 else 0) != n - 1 or req.carry_step != step_id - 1:
                raise RuntimeError(f"request {req.request_id}: input token not produced by the last step")
            if known > 0:
                ids.extend(tokens[start:])
                carry.extend([-1] * known)
            carry.append(req.carry_row)
            ids.append(0)
        if samples:
            req.carry_step, req.carry_row = step_id, first + len(sampled)
            sampled.append(i)
            rng_steps.append(len(tokens) - req.num_prompt + req.num_pending - 1)
    return _Scan(*(np.array(x, np.int64) for x in (starts, counts, rows, ids, carry, sampled, rng_steps)))


def _concat(decodes: _Scan, items: _Scan) -> _Scan:
    if not len(items.starts):
        return decodes
    if not len(decodes.starts):
        return items
    return _Scan(*(np.concatenate(pair) for pair in zip(decodes, items, strict=True)))


def _sampling_rows(rows: RowState, sampled_rows: np.ndarray, cu: np.ndarray, scan: _Scan) -> tuple:
    consts = rows.sampling[sampled_rows]  # [S, 6]: see Request.sampling_row
    temperature = consts[:, 0].astype(np.float32)
    return (
        cu[scan.sampled + 1].astype(np.int64) - 1,
        temperature,
        consts[:, 1].astype(np.float32),
        consts[:, 2].astype(np.int64),
        consts[:, 3].astype(np.int64),
        scan.rng_steps,
        bool((temperature > 0).any()),
        bool(consts[:, 4].any()),
        bool(consts[:, 5].any()),
    )
