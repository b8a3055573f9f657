"""Per-(row, sample) request state as the scheduler and the postprocessor see it."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from batchgen.config import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"  # queued, or preempted and waiting to be recomputed
    RUNNING = "running"  # holds KV blocks, scheduled each step
    FINISHED = "finished"


class RowCounter:
    """A per-step counter of a request. While the request holds a row of the persistent batch it lives
    in that batch's array of the same name (``rows.py``), where the scheduler, the batch builder and the
    postprocessor update all rows at once; otherwise on the request itself."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name, self.own = name, "_" + name

    def __get__(self, req: Request | None, owner: type | None = None) -> Any:
        if req is None:
            return self
        if req.row >= 0:
            return int(getattr(req.batch, self.name)[req.row])
        return getattr(req, self.own)

    def __set__(self, req: Request, value: int) -> None:
        if req.row >= 0:
            getattr(req.batch, self.name)[req.row] = value
        else:
            setattr(req, self.own, value)


@dataclass(eq=False)
class Request:
    """One (row, sample). ``tokens`` holds the prompt then every confirmed output token.

    KV bookkeeping: ``num_computed`` positions are written (or being written by in-flight steps);
    ``num_pending`` tokens were sampled by in-flight steps and are not known on the host yet, so the
    request's logical length is ``len(tokens) + num_pending``.
    """

    request_id: int
    index: int
    sample: int
    key: Any
    params: SamplingParams
    tokens: list[int]
    num_prompt: int
    max_tokens: int  # output tokens allowed (max_new_tokens capped by max_model_len)
    rng_key: int  # counter-based RNG key from (seed, index, sample)
    parent: Request | None = None  # sample 0 of the same row: siblings wait for its prefill
    status: Status = Status.WAITING
    admitted: bool = False  # was scheduled at least once (a drain lets it finish)
    block_table: list[int] = field(default_factory=list)  # only appended to, or replaced by release
    row: int = -1  # its row of the persistent batch (engine/rows.py) while it runs
    batch: Any = field(default=None, repr=False)  # the RowState holding that row
    finish_reason: str | None = None
    logprobs: list[float] | None = None
    text: str | None = None  # final text once a stop string matched
    guide: Any = None  # structured output: the row's grammar matcher (engine/grammar.py Guide)
    thinking: Any = None  # the row's reasoning parser and output start (model/reasoning.py Thinking)
    draft: Any = None  # speculative decoding: the row's proposer and guess count (engine/speculative)
    error: str | None = None  # why the row failed mid-generation (finish reason "error")
    # (token id, added to its logit, only before min_tokens): its logit bias and held-back stop ids
    adjustments: tuple[tuple[int, float, bool], ...] = ()
    top_logprobs: list[tuple[tuple[int, float], ...]] | None = None  # per output token: the N most likely
    # per prompt token: its log-probability and its N most likely (the first token's stay None), filled
    # chunk by chunk as the prompt is computed (``prompt_logprobs`` asked)
    prompt_logprobs: list[float | None] | None = None
    prompt_top_logprobs: list[tuple[tuple[int, float], ...] | None] | None = None

    num_computed = RowCounter()
    num_pending = RowCounter()
    num_cached_blocks = RowCounter()  # leading blocks already registered in the prefix cache
    last_step = RowCounter()  # id of the last step that reads or writes this request's KV
    carry_step = RowCounter()  # the last step that samples for this request ...
    carry_row = RowCounter()  # ... and the row of its sampled-token output holding that token
    # Speculative decoding: guesses of an in-flight verify step held at the end of ``tokens`` as if accepted
    # (the next step continues them), and a later in-flight step whose result for this request is void
    # (it continued guesses that were rejected). engine/speculative/accept.py.
    num_guessed = RowCounter()
    void_step = RowCounter()

    def __post_init__(self) -> None:
        self._num_computed = self._num_pending = self._num_cached_blocks = 0
        self._last_step = self._carry_step = self._carry_row = self._void_step = -1
        self._num_guessed = 0
        p = self.params
        # The per-step sampling inputs that never change, in the order of rows.SAMPLING_COLUMNS.
        self.sampling_row = (
            0.0 if p.greedy else p.temperature, p.top_p, p.top_k, p.min_p, self.rng_key, p.repetition_penalty,
            p.presence_penalty, p.frequency_penalty, p.min_tokens, p.logprobs is not None,
            bool(p.logprobs), self.guide is not None, p.top_k > 0 or p.top_p < 1, bool(self.adjustments),
        )  # fmt: skip
        # Reads per-row statistics on the device (engine/row_tokens.py): rebuilt when it takes a row.
        self.stateful = p.penalized or bool(self.adjustments)
        # Its tokens are checked one by one (StopChecker) for what the batched EOS check cannot see.
        self.watched = bool(p.stop or p.stop_token_ids or p.min_tokens) or self.guide is not None

    def add_token(self, token: int) -> None:
        """Append a confirmed output token (the postprocessor's per-row path)."""
        self.tokens.append(token)
        if self.row >= 0:
            self.batch.known[self.row] += 1

    @property
    def num_confirmed(self) -> int:
        """Tokens known for sure: ``tokens`` without the guesses held at its end."""
        return len(self.tokens) - self.num_guessed

    @property
    def num_output(self) -> int:
        return len(self.tokens) - self.num_prompt

    @property
    def length(self) -> int:
        return len(self.tokens) + self.num_pending

    @property
    def remaining(self) -> int:
        """Positions still to compute before (and including) the next sampling position."""
        return self.length - self.num_computed

    @property
    def sampled_scheduled(self) -> int:
        """Output tokens sampled so far, counting in-flight steps."""
        return self.num_output + self.num_pending

    @property
    def output_ids(self) -> list[int]:
        return self.tokens[self.num_prompt :]

    @property
    def prefill_done(self) -> bool:
        return self.num_computed >= self.num_prompt

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED
