"""Per-(row, sample) request state as the scheduler and the postprocessor see it."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from batchgen.config import SamplingParams


class TableMirror:
    """A numpy copy of a request's block table, synced incrementally (tables only grow between
    releases), so the batch builder copies rows instead of re-serialising Python lists each step."""

    __slots__ = ("array", "synced", "version")

    def __init__(self) -> None:
        self.array = np.zeros(16, np.int32)
        self.synced = 0
        self.version = -1

    def sync(self, table: list[int], version: int) -> np.ndarray:
        if version != self.version:
            self.synced, self.version = 0, version
        n = len(table)
        if n > len(self.array):
            self.array = np.resize(self.array, max(n, 2 * len(self.array)))
        if n > self.synced:
            self.array[self.synced : n] = table[self.synced :]
            self.synced = n
        return self.array


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
    table_version: int = 0  # bumped when block_table is replaced: invalidates the numpy mirror
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
        self.table_mirror = TableMirror()
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
