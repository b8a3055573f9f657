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
    """Gather the step's rows of the persistent batch; only tokens and sampling indices are read off
    the requests (one pass over the sequences)."""
    scan = _scan(step)
    num_seqs = step.num_seqs
    starts, counts = np.array(scan.starts, np.int64), np.array(scan.counts, np.int64)
    row_ids = np.array(scan.rows, np.int64)
    seq_lens = starts + counts
    max_seq_len = int(seq_lens.max())
    cu = np.zeros(num_seqs + 1, np.int32)
    np.cumsum(counts, out=cu[1:])
    total = int(cu[-1])
    if total == num_seqs:  # decode only: one token per sequence
        seq_of_row, positions = np.arange(total), starts
    else:
        seq_of_row = np.repeat(np.arange(num_seqs), counts)  # [T]
        positions = starts[seq_of_row] + (np.arange(total) - cu[:-1][seq_of_row])
    tables = rows.tables[row_ids, : -(-max_seq_len // block_size)]  # [B, W] (a copy)
    blocks = tables[seq_of_row, positions // block_size]
    *sampling, masked = _sampling_rows(rows, row_ids[scan.sampled], cu, scan)
    return StepInputs(
        step.step_id,
        np.array(scan.ids, np.int64),
        _carry_rows(scan, total),
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
    starts: list[int]  # [B] first position each item computes
    counts: list[int]  # [B] tokens each item computes
    rows: list[int]  # [B] each item's row of the persistent batch
    ids: list[int]  # [T] input tokens, 0 where carried over
    carry_at: list[int]  # packed rows whose token is carried over ...
    carry_from: list[int]  # ... from these rows of the previous step's sampled tokens
    sampled: list[int]  # [S] items that sample
    rng_steps: list[int]  # [S] index of the output token each sampled row draws


def _scan(step: ScheduledStep) -> _Scan:
    """One pass over the sequences: their positions, rows, input tokens, and which of them sample (each
    such request remembers its output row, for the next step's carry-over)."""
    scan = _Scan([], [], [], [], [], [], [], [])
    starts, counts, rows, ids, carry_at, carry_from, sampled, rng_steps = scan
    step_id = step.step_id
    # The decodes: one token each, sampled. Bound methods: this loop runs once per row and step.
    add_id, add_rng, add_row = ids.append, rng_steps.append, rows.append
    add_carry_at, add_carry_from = carry_at.append, carry_from.append
    for i, (req, start) in enumerate(zip(step.decodes, step.decode_starts, strict=True)):
        tokens = req.tokens
        if len(tokens) > start:
            add_id(tokens[start])
        elif req.carry_step == step_id - 1:  # being sampled by the step before: carried on the device
            add_carry_at(i)
            add_carry_from(req.carry_row)
            add_id(0)
        else:
            raise RuntimeError(f"request {req.request_id}: input token not produced by the last step")
        req.carry_step, req.carry_row = step_id, i
        add_rng(len(tokens) - req.num_prompt + req.num_pending - 1)  # outputs incl. this one
        add_row(req.row)
    num_decodes = len(step.decodes)
    starts.extend(step.decode_starts)
    counts.extend([1] * num_decodes)
    sampled.extend(range(num_decodes))
    for i, (req, start, n, samples) in enumerate(step.items, num_decodes):
        starts.append(start)
        counts.append(n)
        rows.append(req.row)
        tokens = req.tokens
        known = len(tokens) - start
        if known >= n:
            ids.extend(tokens[start : start + n])
        else:  # the one token the previous step is sampling right now: carried over on the device
            if (known if known > 0 else 0) != n - 1 or req.carry_step != step_id - 1:
                raise RuntimeError(f"request {req.request_id}: input token not produced by the last step")
            if known > 0:
                ids.extend(tokens[start:])
            carry_at.append(len(ids))
            carry_from.append(req.carry_row)
            ids.append(0)
        if samples:
            req.carry_step, req.carry_row = step_id, len(sampled)
            sampled.append(i)
            rng_steps.append(len(tokens) - req.num_prompt + req.num_pending - 1)
    return scan


def _carry_rows(scan: _Scan, total: int) -> np.ndarray:
    if len(scan.carry_at) == total:  # every token carried over: the async decode steady state
        return np.array(scan.carry_from, np.int64)
    out = np.full(total, -1, np.int64)
    out[scan.carry_at] = scan.carry_from
    return out


def _sampling_rows(rows: RowState, sampled_rows: np.ndarray, cu: np.ndarray, scan: _Scan) -> tuple:
    consts = rows.sampling[sampled_rows]  # [S, 6]: see Request.sampling_row
    temperature = consts[:, 0].astype(np.float32)
    return (
        cu[np.asarray(scan.sampled, np.int64) + 1].astype(np.int64) - 1,
        temperature,
        consts[:, 1].astype(np.float32),
        consts[:, 2].astype(np.int64),
        consts[:, 3].astype(np.int64),
        np.array(scan.rng_steps, np.int64),
        bool((temperature > 0).any()),
        bool(consts[:, 4].any()),
        bool(consts[:, 5].any()),
    )
