"""The persistent batch: per-running-request rows of numpy state that stay in place from step to step.

A request holds a row from admission until it stops running (finished or preempted). Its row keeps:
- its block table, written when it changes (admission, a new block: once every ``block_size`` decode
  steps), so building a step gathers rows with one fancy index;
- its sampling constants and the constants the postprocessor checks (limit, EOS, watched rows);
- its per-step counters (``Request``'s ``RowCounter`` fields live here while it holds the row), so the
  scheduler, the batch builder and the postprocessor advance hundreds of decoding rows with a few array
  operations instead of a Python loop over them (host time per step bounds a small model's GPU).

Pure numpy; the scheduler claims and frees rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from batchgen.engine.step_sampling import RowInit

if TYPE_CHECKING:
    from batchgen.engine.request import Request

# Request.sampling_row: a request's per-step sampling constants, one column each
SAMPLING_COLUMNS = (
    "temperature", "top_p", "top_k", "min_p", "rng_key", "repetition_penalty", "presence_penalty",
    "frequency_penalty", "min_tokens", "logprobs", "top_logprobs", "constrained", "truncates", "adjusted",
)  # fmt: skip
COLUMN = {name: i for i, name in enumerate(SAMPLING_COLUMNS)}
COUNTERS = (
    "num_computed", "num_pending", "num_cached_blocks", "last_step", "carry_step", "carry_row", "num_guessed",
    "void_step",
)  # fmt: skip
_INT_COLUMNS = COUNTERS + ("synced", "known", "prompt", "limit", "owner")


class RowState:
    def __init__(self, rows: int = 256, blocks_per_row: int = 64) -> None:
        self.tables = np.zeros((rows, blocks_per_row), np.int32)  # [R, W] block ids, 0 past the end
        self.sampling = np.zeros((rows, len(SAMPLING_COLUMNS)), np.float64)  # [R, C]
        # [R] int64 each: the counters, then leading table entries written, len(tokens), the prompt's
        # length, prompt + max output tokens, the request id holding the row (-1: free).
        for name in _INT_COLUMNS:
            setattr(self, name, np.zeros(rows, np.int64))
        self.owner[:] = -1
        self.check_eos = np.zeros(rows, bool)  # [R] an EOS token ends it (not --ignore-eos)
        self.watched = np.zeros(rows, bool)  # [R] stop strings or a grammar: checked one by one
        self._free = list(range(rows - 1, -1, -1))  # lowest row first: active rows stay dense
        # Requests that took a row and read per-row statistics on the device (penalties, adjustments):
        # the next step rebuilds their rows there first (``take_inits``, engine/row_tokens.py).
        self._inits: list[Request] = []

    @property
    def num_rows(self) -> int:
        return len(self.tables)

    def claim(self, req: Request) -> None:
        """Give ``req`` a row: its counters move into the arrays, with its constants and block table."""
        if req.row >= 0:
            raise RuntimeError(f"request {req.request_id} already holds row {req.row}")
        if not self._free:
            self._grow_rows()
        row = self._free.pop()
        self.num_computed[row], self.num_pending[row] = req._num_computed, req._num_pending
        self.num_cached_blocks[row], self.last_step[row] = req._num_cached_blocks, req._last_step
        self.carry_step[row], self.carry_row[row] = req._carry_step, req._carry_row
        self.num_guessed[row], self.void_step[row] = req._num_guessed, req._void_step
        self.known[row], self.prompt[row] = len(req.tokens), req.num_prompt
        self.limit[row], self.owner[row] = req.num_prompt + req.max_tokens, req.request_id
        self.check_eos[row] = not req.params.ignore_eos
        self.watched[row] = req.watched
        self.sampling[row] = req.sampling_row
        req.row, req.batch = row, self
        self.sync_table(req)
        if req.stateful:
            self._inits.append(req)

    def take_inits(self) -> list[RowInit]:
        """The rows claimed since the last call whose device statistics must be rebuilt (still held)."""
        inits = [
            RowInit(req.row, req.tokens[: req.num_prompt], req.tokens[req.num_prompt :], req.adjustments)
            for req in self._inits
            if req.row >= 0 and self.owner[req.row] == req.request_id
        ]
        self._inits.clear()
        return inits

    def free(self, req: Request) -> None:
        """Return ``req``'s row: its counters move back onto it; its table entries are zeroed (a row's
        padding stays 0 for its next user)."""
        row = req.row
        if row < 0:
            return
        req._num_computed, req._num_pending = int(self.num_computed[row]), int(self.num_pending[row])
        req._num_cached_blocks, req._last_step = int(self.num_cached_blocks[row]), int(self.last_step[row])
        req._carry_step, req._carry_row = int(self.carry_step[row]), int(self.carry_row[row])
        req._num_guessed, req._void_step = int(self.num_guessed[row]), int(self.void_step[row])
        self.tables[row, : self.synced[row]] = 0
        self.synced[row], self.owner[row] = 0, -1
        self._free.append(row)
        req.row, req.batch = -1, None

    def sync_table(self, req: Request) -> None:
        """Write the block ids appended to ``req.block_table`` since the last sync (tables only grow
        while a request runs: a release frees the row)."""
        row, table = req.row, req.block_table
        done, n = int(self.synced[row]), len(table)
        if n <= done:
            return
        if n > self.tables.shape[1]:
            self._widen(n)
        self.tables[row, done:n] = table[done:]
        self.synced[row] = n

    def trim_table(self, req: Request) -> None:
        """Forget the table entries past ``req.block_table``'s end (blocks it gave back)."""
        row, n = req.row, len(req.block_table)
        self.tables[row, n : self.synced[row]] = 0
        self.synced[row] = min(int(self.synced[row]), n)

    def append_blocks(self, rows: np.ndarray, blocks: list[int]) -> None:
        """One new block at the end of each of ``rows``' tables (distinct rows; their requests' lists
        were appended to by the caller)."""
        at = self.synced[rows]  # [K]
        if len(at) and int(at.max()) >= self.tables.shape[1]:
            self._widen(int(at.max()) + 1)
        self.tables[rows, at] = blocks
        self.synced[rows] = at + 1

    def _grow_rows(self) -> None:
        old = self.num_rows
        for name in ("tables", "sampling", "check_eos", "watched", *_INT_COLUMNS):
            array = getattr(self, name)
            setattr(self, name, np.concatenate([array, np.zeros_like(array)]))
        self.owner[old:] = -1
        self._free = list(range(2 * old - 1, old - 1, -1))  # empty before: every row was taken

    def _widen(self, width: int) -> None:
        wider = np.zeros((self.num_rows, max(width, 2 * self.tables.shape[1])), np.int32)
        wider[:, : self.tables.shape[1]] = self.tables
        self.tables = wider
