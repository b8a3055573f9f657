"""Scheduled step -> packed host arrays (numpy): tokens, positions, KV slots, block tables, sampling rows.

No padding inside a step: the new tokens of all sequences are packed into T rows. A decode whose input
token is still being sampled by the previous (in-flight) step gets a placeholder and a carry-over row:
the runner patches it in on the device from the previous step's output.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from batchgen.engine.rows import COLUMN, RowState
from batchgen.engine.scheduler import ScheduledStep
from batchgen.engine.step_sampling import RowInit, SamplingFeatures

if TYPE_CHECKING:
    from batchgen.engine.request import Request


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
    # the sampled rows' parameters (sampler.SamplingTensors, same names)
    temperature: np.ndarray  # [S] float32
    top_p: np.ndarray  # [S] float32
    top_k: np.ndarray  # [S] int64 (0 = off)
    min_p: np.ndarray  # [S] float32
    rng_keys: np.ndarray  # [S] int64: per-(row, sample) key
    rng_steps: np.ndarray  # [S] int64: index of the output token being sampled
    repetition_penalty: np.ndarray  # [S] float32
    presence_penalty: np.ndarray  # [S] float32
    frequency_penalty: np.ndarray  # [S] float32
    min_tokens: np.ndarray  # [S] int64
    state_rows: np.ndarray  # [S] int64: rows of the persistent batch (their device statistics)
    features: SamplingFeatures  # what the step's sampler computes
    max_q_len: int
    max_seq_len: int
    # Some sampled row is constrained (structured output): the runner computes the logits, and samples
    # once the engine has filled the step's token masks (``runner.sample``).
    masked: bool = False
    # Rows whose device statistics (penalties, adjustments) are rebuilt before this step samples.
    row_inits: tuple[RowInit, ...] = ()
    rows_capacity: int = 0  # the persistent batch's rows (the statistics' size)
    # Prompt log-probabilities: the token rows whose logits score the next prompt token, and that token
    # ([P] int64 each; None: none in this step). Such a step runs eagerly.
    prompt_rows: np.ndarray | None = None
    prompt_targets: np.ndarray | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def decode_only(self) -> bool:
        return self.max_q_len == 1


def build_step(step: ScheduledStep, block_size: int, rows: RowState) -> StepInputs:
    """Gather the step's rows of the persistent batch: the decodes' inputs with array operations over
    their rows, the prefill chunks' one by one."""
    decodes = _scan_decodes(step, rows) if step.decodes.drafts is None else _scan_verify(step, rows)
    scan = _concat(decodes, _scan_items(step, len(decodes.starts), len(decodes.sampled)))
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
    inits = tuple(rows.take_inits())
    prompt_rows, prompt_targets = _prompt_rows(step, cu)
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
        row_inits=inits,
        rows_capacity=rows.num_rows,
        prompt_rows=prompt_rows,
        prompt_targets=prompt_targets,
    )


class PromptSpan(NamedTuple):
    """Prompt positions [start, stop) of a request whose logits this step scores (the token after each)."""

    request: Request
    sequence: int  # the step's sequence computing them
    start: int
    stop: int


def prompt_spans(step: ScheduledStep) -> list[PromptSpan]:
    """The prompt positions this step scores, in step order: of each chunk that wants prompt
    log-probabilities, those whose next token is still a prompt token."""
    spans, first = [], len(step.decodes.requests)
    for i, (req, start, n, _) in enumerate(step.items, first):
        stop = min(start + n, req.num_prompt - 1)
        if req.prompt_logprobs is not None and stop > start:
            spans.append(PromptSpan(req, i, start, stop))
    return spans


def _prompt_rows(step: ScheduledStep, cu: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
    spans = prompt_spans(step)
    if not spans:
        return None, None
    rows = np.concatenate([np.arange(cu[s.sequence], cu[s.sequence] + s.stop - s.start) for s in spans])
    targets = np.concatenate([np.array(s.request.tokens[s.start + 1 : s.stop + 1], np.int64) for s in spans])
    return rows.astype(np.int64), targets


class _Scan(NamedTuple):
    """The step's sequences as arrays (int64 each)."""

    starts: np.ndarray  # [B] first position each computes
    counts: np.ndarray  # [B] tokens each computes
    rows: np.ndarray  # [B] each one's row of the persistent batch
    ids: np.ndarray  # [T] input tokens, 0 where carried over
    carry_rows: np.ndarray  # [T] row of the previous step's sampled tokens holding the input, else -1
    sampled: np.ndarray  # [S] sequences that sample (a verify step's decodes: once per position)
    rng_steps: np.ndarray  # [S] index of the output token each sampled row draws
    back: np.ndarray  # [S] how many positions before its sequence's last each sampled row is


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
    zeros = np.zeros(n, np.int64)
    return _Scan(starts, np.ones(n, np.int64), rows, ids, carry_rows, np.arange(n), rng_steps, zeros)


def _scan_verify(step: ScheduledStep, rs: RowState) -> _Scan:
    """A verify step's decodes (engine/speculative): each computes its input token and its guesses, and
    samples at every one of those positions, drawing the output index it would draw there in plain
    decoding. An input token the step before is still sampling (the last position of its row there, whose
    guesses the row holds as accepted) is carried over on the device, as a plain decode's."""
    decodes, step_id = step.decodes, step.step_id
    rows, starts, n = decodes.rows, decodes.starts, len(decodes.rows)
    known = rs.known[rows] > starts  # [D]
    stale = ~known & (rs.carry_step[rows] != step_id - 1)
    if stale.any():
        req = decodes.requests[int(np.argmax(stale))]
        raise RuntimeError(f"request {req.request_id}: input token not produced by the last step")
    counts = decodes.counts  # [D]
    triples = zip(decodes.requests, starts.tolist(), known.tolist(), strict=True)
    firsts = [req.tokens[s] if k else 0 for req, s, k in triples]  # 0: carried over
    ids = [t for first, g in zip(firsts, decodes.drafts, strict=True) for t in (first, *g)]
    seq = np.repeat(np.arange(n), counts)  # [S] each sampled position's decode
    first = np.cumsum(counts) - counts  # [D] its first token and sampled row
    offset = np.arange(len(seq)) - first[seq]  # [S] position within its decode
    carry = np.full(len(seq), -1, np.int64)
    carry[first[~known]] = rs.carry_row[rows[~known]]
    rs.carry_step[rows] = step_id
    rs.carry_row[rows] = first + counts - 1
    rng_steps = (rs.known[rows] + rs.num_pending[rows] - rs.prompt[rows] - 1)[seq] + offset
    return _Scan(
        starts, counts, rows, np.array(ids, np.int64), carry, seq, rng_steps, counts[seq] - 1 - offset
    )


def _scan_items(step: ScheduledStep, first: int, first_sample: int) -> _Scan:
    """The prefill chunks (a few a step), one by one; sequence numbers start at ``first``, their sampled
    rows at ``first_sample``."""
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
            req.carry_step, req.carry_row = step_id, first_sample + len(sampled)
            sampled.append(i)
            rng_steps.append(len(tokens) - req.num_prompt + req.num_pending - 1)
    back = [0] * len(sampled)
    return _Scan(
        *(np.array(x, np.int64) for x in (starts, counts, rows, ids, carry, sampled, rng_steps, back))
    )


def _concat(decodes: _Scan, items: _Scan) -> _Scan:
    if not len(items.starts):
        return decodes
    if not len(decodes.starts):
        return items
    return _Scan(*(np.concatenate(pair) for pair in zip(decodes, items, strict=True)))


def _sampling_rows(rows: RowState, sampled_rows: np.ndarray, cu: np.ndarray, scan: _Scan) -> tuple:
    """The sampled rows' parameters in StepInputs' order, the step's features, and whether it is masked."""
    consts = rows.sampling[sampled_rows]  # [S, C]: see Request.sampling_row

    def column(name: str, dtype=np.float32) -> np.ndarray:
        return consts[:, COLUMN[name]].astype(dtype)

    def some(name: str, rows_of: np.ndarray | None = None) -> bool:
        values = consts[:, COLUMN[name]]
        return bool((values if rows_of is None else values[rows_of]).any())

    temperature = column("temperature")
    sampling = temperature > 0
    repetition = column("repetition_penalty")
    presence, frequency = column("presence_penalty"), column("frequency_penalty")
    features = SamplingFeatures(
        sampling=bool(sampling.any()),
        truncation=some("truncates", sampling),
        logprobs=some("logprobs"),
        top_logprobs=some("top_logprobs"),
        penalties=bool((repetition != 1).any() or presence.any() or frequency.any()),
        adjustments=some("adjusted"),
    )
    return (
        cu[scan.sampled + 1].astype(np.int64) - 1 - scan.back,
        temperature,
        column("top_p"),
        column("top_k", np.int64),
        column("min_p"),
        column("rng_key", np.int64),
        scan.rng_steps,
        repetition,
        presence,
        frequency,
        column("min_tokens", np.int64),
        sampled_rows.astype(np.int64),
        features,
        some("constrained"),
    )
