"""A draft model's own paged KV: its blocks, and which of each row's positions they hold.

No torch. The draft keeps KV for the rows it guesses for, apart from the target's (the engine's block
manager never sees it): a row's draft KV is a function of its tokens alone, so it stays valid across the
target's preemptions and prefix-cache reuse, and is only ever extended, or cut back where a guess was
rejected. Rows are looked up by request; a row the draft has not seen for a while gives its blocks back
when another needs them (finished rows first, then the least recently guessed), and a row that cannot get
blocks guesses nothing that step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from batchgen.engine.request import Request


@dataclass(eq=False)
class DraftRow:
    """One request's draft KV: ``computed`` leading positions hold its tokens' KV, and the positions
    after them its last guesses' (``ahead``), valid for as many as the row's tokens confirm."""

    request: Request
    blocks: list[int] = field(default_factory=list)
    computed: int = 0
    ahead: list[int] = field(default_factory=list)
    used: int = 0  # the proposal round that last used it

    def sync(self) -> None:
        """Keep the positions whose input was confirmed: the guesses the target accepted count, the rest
        are rolled back. The last known token is always computed again (its logits give the first guess)."""
        tokens = self.request.tokens
        matched = 0
        for guess, token in zip(self.ahead, tokens[self.computed :], strict=False):
            if guess != token:
                break
            matched += 1
        self.computed = min(self.computed + matched, len(tokens) - 1)
        self.ahead = []


class DraftPool:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))
        self._rows: dict[int, DraftRow] = {}  # by request id
        self._round = 0
        self.evicted = 0  # rows whose blocks another row took

    @property
    def num_free(self) -> int:
        return len(self._free)

    def begin(self, requests: list[Request]) -> None:
        """A new proposal round for ``requests`` (they are never evicted during it)."""
        self._round += 1
        if len(self._rows) > 2 * len(requests) + 64:  # finished rows' blocks back, now and then
            for row in [r for r in self._rows.values() if r.request.finished]:
                self._drop(row)

    def row(self, req: Request) -> DraftRow:
        """The request's draft row, synced with its tokens (a new one holds nothing)."""
        row = self._rows.get(req.request_id)
        if row is not None and row.request is not req:  # an id reused by a later generate call
            self._drop(row)
            row = None
        if row is None:
            row = self._rows[req.request_id] = DraftRow(req)
        row.used = self._round
        row.sync()
        return row

    def reserve(self, row: DraftRow, positions: int) -> bool:
        """Blocks for the row's first ``positions`` positions, taking other rows' when short (never a row
        of this round); False when they cannot be had (the row keeps what it holds)."""
        need = -(-positions // self.block_size) - len(row.blocks)
        if need <= 0:
            return True
        if need > len(self._free) and not self._evict(need - len(self._free)):
            return False
        row.blocks.extend(self._free.pop() for _ in range(need))
        return True

    def _evict(self, blocks: int) -> bool:
        """Free at least ``blocks`` blocks of rows not used this round: finished rows first, then the least
        recently used. False (nothing freed) when all of them would not be enough."""
        idle = [r for r in self._rows.values() if r.used != self._round]
        if sum(len(r.blocks) for r in idle) < blocks:
            return False
        idle.sort(key=lambda r: (not r.request.finished, r.used))
        for row in idle:
            if blocks <= 0:
                break
            blocks -= len(row.blocks)
            self.evicted += not row.request.finished
            self._drop(row)
        return True

    def _drop(self, row: DraftRow) -> None:
        self._free.extend(reversed(row.blocks))
        row.blocks, row.computed, row.ahead = [], 0, []
        self._rows.pop(row.request.request_id, None)

    def slots(self, row: DraftRow, start: int, stop: int) -> list[int]:
        """KV slots of positions [start, stop) of the row."""
        size, blocks = self.block_size, row.blocks
        return [blocks[p // size] * size + p % size for p in range(start, stop)]
