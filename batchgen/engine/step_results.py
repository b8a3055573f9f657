"""A step's sampled tokens -> its requests: the decodes' tokens with array operations over their rows,
prompt log-probabilities, the most likely alternatives. No torch; the engine checks the rows that may
have ended one by one (``engine.py``)."""

from __future__ import annotations

import numpy as np

from batchgen.engine.batch import prompt_spans
from batchgen.engine.rows import COLUMN, RowState
from batchgen.engine.runner_protocol import StepResult
from batchgen.engine.scheduler import ScheduledStep


def record_prompt_scores(step: ScheduledStep, scores: tuple[list, list, list]) -> None:
    """The step's scored prompt positions (batch.prompt_spans, in order): each scored token's
    log-probability, and its N most likely alternatives when the row asked for them."""
    logprobs, top_ids, top_logprobs = scores
    at = 0
    for span in prompt_spans(step):
        req, count = span.request, span.stop - span.start
        n = req.params.prompt_logprobs
        for k in range(at, at + count):
            position = span.start + 1 + k - at  # the scored token's
            req.prompt_logprobs[position] = logprobs[k]
            if n:
                req.prompt_top_logprobs[position] = tuple(
                    zip(top_ids[k][:n], top_logprobs[k][:n], strict=True)
                )
        at += count


def advance_decodes(
    rs: RowState, step: ScheduledStep, result: StepResult, eos_ids: list[int]
) -> tuple[np.ndarray, np.ndarray]:
    """Give the decodes that still hold their rows (not finished or preempted since they were
    scheduled, nor void: the common case) their tokens at once. Returns that mask [D] and which of them
    may have ended (EOS, length, a watched row: checked one by one)."""
    decodes = step.decodes
    rows, n = decodes.rows, len(decodes.rows)
    held = (rs.owner[rows] == decodes.ids) & (rs.void_step[rows] != step.step_id)  # [D]
    every = bool(held.all())
    at = np.arange(n) if every else np.flatnonzero(held)
    rows = rows if every else rows[at]
    tokens = np.array(result.tokens[:n], np.int64)[at]  # [H]
    rs.num_pending[rows] -= 1
    rs.known[rows] += 1
    reqs = decodes.requests if every else [decodes.requests[i] for i in at.tolist()]
    for req, token in zip(reqs, tokens.tolist(), strict=True):
        req.tokens.append(token)
    if result.logprobs is not None:
        for i in at[rs.sampling[rows, COLUMN["logprobs"]] > 0].tolist():
            req = decodes.requests[i]
            req.logprobs.append(result.logprobs[i])
            if req.top_logprobs is not None:
                req.top_logprobs.append(top_of(result, i, req.params.logprobs))
    ends = (rs.known[rows] >= rs.limit[rows]) | rs.watched[rows]
    for eos in eos_ids:  # one or a few ids: cheaper than np.isin's sort
        ends |= rs.check_eos[rows] & (tokens == eos)
    return held, at[ends]


def rows_to_check(held: np.ndarray, ends: np.ndarray, num_sampled: int) -> list[int]:
    """Sampled rows to look at one by one, in order: decodes that may have ended or were not
    advanced at once, then the prefill chunks'."""
    look = np.union1d(ends, np.flatnonzero(~held))
    return [*look.tolist(), *range(len(held), num_sampled)]


def top_of(result: StepResult, row: int, n: int) -> tuple[tuple[int, float], ...]:
    """Sampled row ``row``'s ``n`` most likely tokens and their log-probabilities, the best first. A
    tuple of tuples of numbers, which the garbage collector stops tracking: a run that keeps these for
    every token of every row in flight would otherwise make each full collection a long stall."""
    return tuple(zip(result.top_ids[row][:n], result.top_logprobs[row][:n], strict=True))
