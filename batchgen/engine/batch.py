"""Scheduled step -> packed host arrays (numpy): tokens, positions, KV slots, block tables, sampling rows.

No padding inside a step: the new tokens of all sequences are packed into T rows. A decode whose input
token is still being sampled by the previous (in-flight) step gets a placeholder and a carry-over row:
the runner patches it in on the device from the previous step's output.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

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

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def decode_only(self) -> bool:
        return self.max_q_len == 1


def build_step(step: ScheduledStep, block_size: int) -> StepInputs:
    items = step.items
    starts = np.fromiter((it.start for it in items), np.int64, len(items))
    counts = np.fromiter((it.num_tokens for it in items), np.int64, len(items))
    cu = np.zeros(len(items) + 1, np.int32)
    np.cumsum(counts, out=cu[1:])
    total = int(cu[-1])
    seq_of_row = np.repeat(np.arange(len(items)), counts)  # [T]
    positions = starts[seq_of_row] + (np.arange(total) - cu[:-1][seq_of_row])
    tables = _block_tables(step)
    blocks = tables[seq_of_row, positions // block_size]
    input_ids, carry_rows = _input_tokens(step, total)
    sampling = _sampling_rows(step, cu)
    return StepInputs(
        step.step_id,
        input_ids,
        carry_rows,
        positions,
        blocks.astype(np.int64) * block_size + positions % block_size,
        cu,
        (starts + counts).astype(np.int32),
        tables,
        *sampling,
        max_q_len=int(counts.max()),
        max_seq_len=int((starts + counts).max()),
    )


def _block_tables(step: ScheduledStep) -> np.ndarray:
    width = max(len(it.request.block_table) for it in step.items)
    tables = np.zeros((len(step.items), width), np.int32)
    for i, it in enumerate(step.items):
        table = it.request.block_table
        tables[i, : len(table)] = table
    return tables


def _input_tokens(step: ScheduledStep, total: int) -> tuple[np.ndarray, np.ndarray]:
    input_ids = np.zeros(total, np.int64)
    carry_rows = np.full(total, -1, np.int64)
    row = 0
    for it in step.items:
        req = it.request
        known = min(it.num_tokens, max(len(req.tokens) - it.start, 0))
        input_ids[row : row + known] = req.tokens[it.start : it.start + known]
        if known < it.num_tokens:  # the one token the previous step is sampling right now
            if it.num_tokens - known != 1 or req.carry_step != step.step_id - 1:
                raise RuntimeError(f"request {req.request_id}: input token not produced by the last step")
            carry_rows[row + known] = req.carry_row
        row += it.num_tokens
    return input_ids, carry_rows


def _sampling_rows(step: ScheduledStep, cu: np.ndarray) -> tuple:
    sampled = [(i, it.request) for i, it in enumerate(step.items) if it.samples]
    logits_indices = np.fromiter((cu[i + 1] - 1 for i, _ in sampled), np.int64, len(sampled))
    for row, (_, req) in enumerate(sampled):
        req.carry_step, req.carry_row = step.step_id, row
    params = [req.params for _, req in sampled]
    temperature = np.fromiter((0.0 if p.greedy else p.temperature for p in params), np.float32, len(params))
    return (
        logits_indices,
        temperature,
        np.fromiter((p.top_p for p in params), np.float32, len(params)),
        np.fromiter((p.top_k for p in params), np.int64, len(params)),
        np.fromiter((req.rng_key for _, req in sampled), np.int64, len(sampled)),
        np.fromiter((req.sampled_scheduled - 1 for _, req in sampled), np.int64, len(sampled)),
        bool((temperature > 0).any()),
        any(p.logprobs for p in params),
    )
