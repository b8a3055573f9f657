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
    num_computed: int = 0
    num_pending: int = 0
    num_cached_blocks: int = 0  # leading blocks already registered in the prefix cache
    last_step: int = -1  # id of the last step that reads or writes this request's KV
    carry_step: int = -1  # the last step that samples for this request ...
    carry_row: int = -1  # ... and the row of its sampled-token output holding that token
    finish_reason: str | None = None
    logprobs: list[float] | None = None
    text: str | None = None  # final text once a stop string matched
    guide: Any = None  # structured output: the row's grammar matcher (engine/grammar.py Guide)
    error: str | None = None  # why the row failed mid-generation (finish reason "error")

    def __post_init__(self) -> None:
        p = self.params
        # The per-step sampling inputs that never change: (temperature, top_p, top_k, rng key, logprobs,
        # constrained).
        self.sampling_row = (
            0.0 if p.greedy else p.temperature,
            p.top_p,
            p.top_k,
            self.rng_key,
            p.logprobs,
            self.guide is not None,
        )

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
