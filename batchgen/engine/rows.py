"""The persistent batch: per-running-request rows of numpy state that stay in place from step to step.

A request holds a row from admission until it stops running (finished or preempted). Its row keeps its
block table and its sampling constants, written when they change (admission, a new block: once every
``block_size`` decode steps), so building a step gathers rows with one fancy index instead of
re-serialising Python lists for every running request every step (issue 12: host time per step).

Pure numpy; the scheduler owns it and is the only writer.
"""

from __future__ import annotations

import numpy as np

from batchgen.engine.request import Request

SAMPLING_COLUMNS = 6  # Request.sampling_row: temperature, top_p, top_k, rng key, logprobs, constrained


class RowState:
    def __init__(self, rows: int = 256, blocks_per_row: int = 64) -> None:
        self.tables = np.zeros((rows, blocks_per_row), np.int32)  # [R, W] block ids, 0 past the end
        self.sampling = np.zeros((rows, SAMPLING_COLUMNS), np.float64)  # [R, 6]
        self.synced = np.zeros(rows, np.int64)  # [R] leading table entries written
        self._free = list(range(rows - 1, -1, -1))  # lowest row first: active rows stay dense

    @property
    def num_rows(self) -> int:
        return len(self.tables)

    def claim(self, req: Request) -> None:
        """Give ``req`` a row holding its sampling constants and its current block table."""
        if req.row >= 0:
            raise RuntimeError(f"request {req.request_id} already holds row {req.row}")
        if not self._free:
            self._grow_rows()
        req.row = row = self._free.pop()
        self.sampling[row] = req.sampling_row
        self.sync_table(req)

    def free(self, req: Request) -> None:
        """Return ``req``'s row (its table entries zeroed: a row's padding stays 0 for its next user)."""
        row = req.row
        if row < 0:
            return
        self.tables[row, : self.synced[row]] = 0
        self.synced[row] = 0
        self._free.append(row)
        req.row = -1

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

    def _grow_rows(self) -> None:
        old = self.num_rows
        self.tables = np.concatenate([self.tables, np.zeros_like(self.tables)])
        self.sampling = np.concatenate([self.sampling, np.zeros_like(self.sampling)])
        self.synced = np.concatenate([self.synced, np.zeros_like(self.synced)])
        self._free = list(range(2 * old - 1, old - 1, -1))  # empty before: every row was taken

    def _widen(self, width: int) -> None:
        wider = np.zeros((self.num_rows, max(width, 2 * self.tables.shape[1])), np.int32)
        wider[:, : self.tables.shape[1]] = self.tables
        self.tables = wider
