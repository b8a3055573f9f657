"""Scheduled step -> packed host arrays (numpy): tokens, positions, KV slots, block tables, sampling rows.

No padding inside a step: the new tokens of all sequences are packed into T rows. A decode whose input
token is still being sampled by the previous (in-flight) step gets a placeholder and a carry-over row:
the runner patches it in on the device from the previous step's output.
"""

from __future__ import annotations

import itertools
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
    tables = [it.request.block_table for it in step.items]
    lengths = np.fromiter(map(len, tables), np.int64, len(tables))
    flat = np.fromiter(itertools.chain.from_iterable(tables), np.int32, int(lengths.sum()))
    out = np.zeros((len(tables), int(lengths.max())), np.int32)
    rows = np.repeat(np.arange(len(tables)), lengths)
    starts = np.cumsum(lengths) - lengths
    out[rows, np.arange(len(flat)) - starts[rows]] = flat  # scatter each ragged table into its row
    return out


def _input_tokens(step: ScheduledStep, total: int) -> tuple[np.ndarray, np.ndarray]:
    ids: list[int] = []
    carry: list[tuple[int, int]] = []  # (packed row, row of the previous step's output)
    for it in step.items:
        req, start, n = it.request, it.start, it.num_tokens
        known = len(req.tokens) - start
        if known >= n:
            ids.extend(req.tokens[start : start + n])
            continue
        # The one token the previous step is sampling right now: carried over on the device.
        if n - max(known, 0) != 1 or req.carry_step != step.step_id - 1:
            raise RuntimeError(f"request {req.request_id}: input token not produced by the last step")
        ids.extend(req.tokens[start:])
        carry.append((len(ids), req.carry_row))
        ids.append(0)
    input_ids = np.array(ids, np.int64)
    carry_rows = np.full(total, -1, np.int64)
    if carry:
        rows, sources = zip(*carry, strict=True)
        carry_rows[list(rows)] = sources
    return input_ids, carry_rows


def _sampling_rows(step: ScheduledStep, cu: np.ndarray) -> tuple:
    rows, temps, top_p, top_k, keys, steps = [], [], [], [], [], []
    logprobs = False
    for i, it in enumerate(step.items):
        if not it.samples:
            continue
        req, p = it.request, it.request.params
        req.carry_step, req.carry_row = step.step_id, len(rows)
        rows.append(cu[i + 1] - 1)
        temps.append(0.0 if p.greedy else p.temperature)
        top_p.append(p.top_p)
        top_k.append(p.top_k)
        keys.append(req.rng_key)
        steps.append(req.num_output + req.num_pending - 1)  # index of the output token being sampled
        logprobs |= p.logprobs
    temperature = np.array(temps, np.float32)
    return (
        np.array(rows, np.int64),
        temperature,
        np.array(top_p, np.float32),
        np.array(top_k, np.int64),
        np.array(keys, np.int64),
        np.array(steps, np.int64),
        bool((temperature > 0).any()),
        logprobs,
    )
