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
    # Some sampled row is constrained (structured output): the runner computes the logits, and samples
    # once the engine has filled the step's token masks (``runner.sample``).
    masked: bool = False

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
    *sampling, masked = _sampling_rows(step, cu)
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
        masked=masked,
    )


def _block_tables(step: ScheduledStep) -> np.ndarray:
    reqs = [it.request for it in step.items]
    width = max(len(r.block_table) for r in reqs)
    out = np.zeros((len(reqs), width), np.int32)
    for row, req in zip(out, reqs, strict=True):
        n = len(req.block_table)
        row[:n] = req.table_mirror.sync(req.block_table, req.table_version)[:n]
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
    sampled = [(i, it.request) for i, it in enumerate(step.items) if it.samples]
    for row, (_, req) in enumerate(sampled):
        req.carry_step, req.carry_row = step.step_id, row
    consts = np.array([req.sampling_row for _, req in sampled], np.float64).reshape(-1, 6)  # [S, 6]
    # Index of the output token each row samples: outputs so far, counting this step's.
    steps = np.fromiter((len(r.tokens) - r.num_prompt + r.num_pending - 1 for _, r in sampled), np.int64)
    temperature = consts[:, 0].astype(np.float32)
    return (
        cu[np.array([i + 1 for i, _ in sampled], np.int64)].astype(np.int64) - 1,
        temperature,
        consts[:, 1].astype(np.float32),
        consts[:, 2].astype(np.int64),
        consts[:, 3].astype(np.int64),
        steps,
        bool((temperature > 0).any()),
        bool(consts[:, 4].any()),
        bool(consts[:, 5].any()),
    )
