"""Continuous batching over the paged KV cache: decodes first, then prefill chunks, preempt by recompute.

No torch. The scheduler may run one step ahead of the device (asynchronous mode): it counts tokens
sampled by in-flight steps as ``num_pending`` and never waits for their values. Running requests hold
rows of the persistent batch (``rows.py``), where their counters live: the decodes of a step (hundreds
of rows, most of the host's time per step when done one by one) are scheduled with a few array
operations over the running rows; only the rows that need a new block or fill one for the prefix cache
(one in ``block_size``) take a Python call each. When the new blocks do not all fit, someone is
preempted and the order matters: the decodes are then scheduled one by one (``_decodes_in_order``, the
reference the array path equals; tests/engine/test_scheduler.py).
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

import numpy as np

from batchgen.engine.admission import Rent
from batchgen.engine.block_manager import BlockManager
from batchgen.engine.request import Request, Status
from batchgen.engine.rows import RowState

# Most prompt tokens a step computes for a request that wants their log-probabilities: each has its logits
# row ([tokens, vocab] float32 at once), where other chunks keep only the last one's.
PROMPT_LOGPROBS_CHUNK = 512


class ScheduledItem(NamedTuple):
    request: Request
    start: int  # first position computed in this step
    num_tokens: int
    samples: bool  # the last position produces a token


class Decodes(NamedTuple):
    """A step's decodes: one token each, always sampled."""

    requests: list[Request]
    rows: np.ndarray  # [D] int64: their rows of the persistent batch
    starts: np.ndarray  # [D] int64: the position each computes
    ids: np.ndarray  # [D] int64: their request ids (a row still holding its request: ``rows.owner``)
    # A verify step (engine/speculative): each decode's guessed tokens, computed after its input token
    # ([] for a row without guesses). None: one token each.
    drafts: list[list[int]] | None = None

    @property
    def counts(self) -> np.ndarray:
        """[D] int64: the positions each decode computes."""
        return positions_per_decode(self.drafts, len(self.rows))


def positions_per_decode(drafts: list[list[int]] | None, num_decodes: int) -> np.ndarray:
    """[D] int64: each decode's input token and its guesses."""
    ones = np.ones(num_decodes, np.int64)
    return ones if drafts is None else ones + [len(d) for d in drafts]


NO_DECODES = Decodes([], np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))


class ScheduledStep(NamedTuple):
    """A step's sequences: the decodes first, then the items (prefill chunks)."""

    step_id: int
    items: list[ScheduledItem]
    decodes: Decodes = NO_DECODES

    @property
    def num_seqs(self) -> int:
        return len(self.decodes.requests) + len(self.items)

    def sampled(self) -> list[Request]:
        """The requests that sample, in the order of the step's sampled-token rows."""
        return [*self.decodes.requests, *(item.request for item in self.items if item.samples)]


def decodes_of(requests: list[Request], starts: list[int], rows: RowState) -> Decodes:
    """The arrays of decodes scheduled one by one (their requests hold rows of ``rows``)."""
    at = np.array([req.row for req in requests], np.int64)
    return Decodes(requests, at, np.array(starts, np.int64), rows.owner[at])


class Scheduler:
    def __init__(self, blocks: BlockManager, max_num_seqs: int, max_batch_tokens: int) -> None:
        self.blocks = blocks
        self.max_num_seqs = max_num_seqs
        self.max_batch_tokens = max_batch_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admission order: the newest is preempted first
        self.num_preemptions = 0
        self.num_partial_prefills = 0  # prefill chunks that stopped before the prompt's end
        self.rows = RowState(max_num_seqs)
        # The reference path (tests): decodes scheduled one at a time and passed on as one-token items,
        # which the batch builder and the postprocessor also handle one by one.
        self.one_by_one = False
        self.rent = Rent()  # when waiting rows join a step that decodes (admission.py); price 0: at once
        self._order: np.ndarray | None = None  # [N] rows of ``running``, made again when it changes
        self._next_step = 0

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, req: Request) -> None:
        """Take a finished request out of scheduling (its blocks are released by the caller)."""
        if req.status is Status.RUNNING:
            self.running.remove(req)
            self.rows.free(req)
            self._order = None
        elif req.status is Status.WAITING and req in self.waiting:
            self.waiting.remove(req)  # preempted, and its in-flight token ended it
        req.status = Status.FINISHED

    def clear(self) -> None:
        """Forget every request (an abandoned stream); the caller releases their blocks."""
        for req in self.running:
            self.rows.free(req)
        self.running.clear()
        self._order = None
        self.waiting.clear()
        self.rent.settle()

    def _running_rows(self) -> np.ndarray:
        if self._order is None:
            self._order = np.fromiter((req.row for req in self.running), np.int64, len(self.running))
        return self._order

    # --- one step ---------------------------------------------------------------------------------

    def schedule(self, drafts: dict[int, list[int]] | None = None) -> ScheduledStep:
        """The next step. ``drafts``: guesses by row of the persistent batch (a verify step; every token
        of the running requests must be known): each decode computes its guesses after its token."""
        step_id = self._next_step
        if self.one_by_one:  # the reference: decodes as one-token items, built and postprocessed so
            reqs, starts, budget, prefills = self._decodes_in_order(step_id, self.max_batch_tokens)
            step = ScheduledStep(
                step_id, [ScheduledItem(r, s, 1, True) for r, s in zip(reqs, starts, strict=True)]
            )
        else:
            decodes, budget, prefills = self._decodes_at_once(step_id, self.max_batch_tokens, drafts)
            step = ScheduledStep(step_id, [], decodes)
        decoding = step.num_seqs
        for req in prefills:  # then chunks of prefills already under way
            if budget == 0 or step.num_seqs >= self.max_num_seqs:
                break
            if req.status is Status.RUNNING and self._reserve(req, budget, step_id):
                budget -= self._append(step, req, budget)
        if not self._holds_back(step, decoding, budget) and self._admit(step, budget):
            self.rent.settle()
        if step.num_seqs:  # ids of launched steps are consecutive: carry-over refers to "the step before"
            self._next_step += 1
        return step

    def _decodes_at_once(
        self, step_id: int, budget: int, drafts: dict[int, list[int]] | None = None
    ) -> tuple[Decodes, int, list[Request]]:
        """One token for each decoding request (and its guesses), in admission order, up to the budget and
        the row limit. Returns the decodes, the budget left and the prefills under way."""
        running, rs, size = self.running, self.rows, self.blocks.block_size
        if not running:
            return NO_DECODES, budget, []
        order = self._running_rows()  # [N] rows, admission order
        computed = rs.num_computed[order]
        length = rs.known[order] + rs.num_pending[order]
        live = length < rs.limit[order]  # else its last token is already in flight
        decoding = live & (length - computed == 1)
        # [D] their places in ``running``. When the decodes fill the step, no prefill chunk fits.
        at = np.flatnonzero(decoding)[: min(budget, self.max_num_seqs)]
        rows, starts = order[at], computed[at]
        guesses = _guesses(drafts, rows, budget, size)
        ends = starts + positions_per_decode(guesses, len(rows))  # [D]
        grows = ends > rs.synced[rows] * size  # [D] past the last block: a new one (guesses < block_size)
        if guesses is not None and np.count_nonzero(grows) > self.blocks.num_free:
            return self._decodes_at_once(step_id, budget)  # no room for the guesses: a plain step
        if np.count_nonzero(grows) > self.blocks.num_free:  # someone is preempted: order matters
            reqs, starts, budget, prefills = self._decodes_in_order(step_id, budget)
            return decodes_of(reqs, starts, rs), budget, prefills
        reqs = running[:] if len(at) == len(running) else [running[i] for i in at.tolist()]
        # [D] blocks whose tokens are all known and computed (never a guess's: it may be rolled back)
        full = np.minimum(starts + 1, rs.known[rows] - rs.num_guessed[rows]) // size
        self._blocks_in_order(reqs, rows, ends, grows, full)
        rs.num_computed[rows] = ends
        rs.num_pending[rows] += 1
        rs.last_step[rows] = step_id
        prefills = [running[i] for i in np.flatnonzero(live & ~decoding).tolist()]
        decodes = Decodes(reqs, rows, starts, rs.owner[rows], guesses)
        return decodes, budget - int(ends.sum() - starts.sum()), prefills

    def _blocks_in_order(
        self, reqs: list[Request], rows: np.ndarray, ends: np.ndarray, grows: np.ndarray, full: np.ndarray
    ) -> None:
        """A new block for each decode whose block is full (the caller checked that they fit), and the
        blocks the decodes filled made findable by prefix: about one row in ``block_size`` each. Row by
        row in admission order, as the one-by-one path does them: a block handed out can evict a cached
        one a later row would otherwise register."""
        rs = self.rows
        cached = rs.num_cached_blocks[rows]
        fills = full > cached
        grown, new = [], []
        for i in np.flatnonzero(grows | fills).tolist():
            req = reqs[i]
            if grows[i]:
                self.blocks.grow(req, int(ends[i]))  # one block, as ``_reserve`` grows it
                grown.append(i)
                new.append(req.block_table[-1])
            if fills[i]:
                self.blocks.register_blocks(req, int(cached[i]), int(full[i]))
        if grown:
            rs.append_blocks(rows[grown], new)
        rs.num_cached_blocks[rows[fills]] = full[fills]

    def _decodes_in_order(self, step_id: int, budget: int) -> tuple[list[Request], list[int], int, list]:
        """``_decodes_at_once`` one request at a time (a block reservation may preempt a later one):
        the decodes, their positions, the budget left and the prefills under way."""
        size, max_seqs = self.blocks.block_size, self.max_num_seqs
        decodes, starts, prefills = [], [], []
        for req in self.running[:]:  # a copy: reserving a block may preempt (remove) a later request
            length = req.length
            if length - req.num_prompt >= req.max_tokens:
                continue  # its last token is already in flight
            pos = req.num_computed
            if length - pos != 1:
                prefills.append(req)
                continue
            if budget == 0 or len(decodes) >= max_seqs:
                break  # nothing more fits this step, prefills included
            if req.status is not Status.RUNNING:  # preempted to make room for an earlier one
                continue
            if pos >= len(req.block_table) * size and not self._reserve(req, budget, step_id):
                continue
            decodes.append(req)
            starts.append(pos)
            req.num_computed, req.last_step = pos + 1, step_id
            req.num_pending += 1
            budget -= 1
            if pos + 1 >= (req.num_cached_blocks + 1) * size:
                self.blocks.register_full_blocks(req, pos + 1)
        return decodes, starts, budget, prefills

    def _reserve(self, req: Request, budget: int, step_id: int) -> bool:
        """Make room for ``req``'s next chunk, preempting the newest requests this step has not
        scheduled yet if needed."""
        need = req.num_computed + min(req.remaining, budget)
        if need <= len(req.block_table) * self.blocks.block_size:
            return True  # the common decode case: the current block has room
        while not self.blocks.can_grow(req, need):
            victim = next((r for r in reversed(self.running) if r.last_step != step_id), None)
            if victim is None:
                return False
            self._preempt(victim)
            if victim is req:
                return False
        self.blocks.grow(req, need)
        self.rows.sync_table(req)
        return True

    def _append(self, step: ScheduledStep, req: Request, budget: int) -> int:
        remaining = req.remaining
        n = min(remaining, budget)
        if req.prompt_logprobs is not None and not req.prefill_done:
            n = min(n, PROMPT_LOGPROBS_CHUNK)  # its chunk's logits are all computed: bounded
        samples = n == remaining
        step.items.append(ScheduledItem(req, req.num_computed, n, samples))
        req.num_computed += n
        req.last_step = step.step_id
        if samples:
            req.num_pending += 1
        else:
            self.num_partial_prefills += 1
        if req.num_computed >= (req.num_cached_blocks + 1) * self.blocks.block_size:
            self.blocks.register_full_blocks(req, req.num_computed)
        return n

    def _preempt(self, req: Request) -> None:
        """Recompute later: drop the KV, keep the tokens (in-flight ones still arrive)."""
        self.running.remove(req)
        self.rows.free(req)
        self._order = None
        self.blocks.release(req)
        req.num_computed = 0
        req.status = Status.WAITING
        self.waiting.appendleft(req)
        self.num_preemptions += 1

    # --- admission --------------------------------------------------------------------------------

    def _holds_back(self, step: ScheduledStep, decoding: int, budget: int) -> bool:
        """Rent or buy (admission.py): whether waiting rows stay out of this step. They join at once when
        the step has nothing to decode or runs a prompt's chunk (it costs a step with prompts anyway), or
        when the rows the free ones could take need more than the step's token budget, each estimated by
        the first waiting row's tokens (waiting would batch nothing)."""
        waiting = self.waiting
        if not self.rent.price or not waiting or not self._admissible(waiting[0]):
            return False
        free = self.max_num_seqs - step.num_seqs
        takes = min(free, len(waiting))
        joins_anyway = not decoding or step.num_seqs > decoding or takes * waiting[0].remaining >= budget
        return self.rent.holds(free, len(waiting), joins_anyway)

    def _admit(self, step: ScheduledStep, budget: int) -> int:
        """Start waiting requests while they fit; returns how many started."""
        held: list[Request] = []
        started = 0
        while self.waiting and budget > 0 and step.num_seqs < self.max_num_seqs:
            req = self.waiting[0]
            if req.guide is not None and step.decodes.drafts is not None:
                break  # a constrained row starts in a plain step: its token masks are one a sampled row
            if not self._admissible(req):
                held.append(self.waiting.popleft())  # a sibling waiting for its row's prefill
                continue
            if not self._try_start(req, budget):
                break
            self.waiting.popleft()
            budget -= self._append(step, req, budget)
            started += 1
        self.waiting.extendleft(reversed(held))
        return started

    def _admissible(self, req: Request) -> bool:
        if req.num_pending:  # a preempted request whose last token is still in flight
            return False
        parent = req.parent
        return parent is None or parent.finished or parent.prefill_done

    def _try_start(self, req: Request, budget: int) -> bool:
        if req.prompt_logprobs is None:  # else every prompt position is computed, for its logits
            self.blocks.match_prefix(req)
        need = req.num_computed + min(req.remaining, budget)
        if not self.blocks.can_grow(req, need):
            self.blocks.release(req)
            req.num_computed = 0
            return False
        self.blocks.grow(req, need)
        self.blocks.count_lookup(req)
        self.rows.claim(req)
        req.status = Status.RUNNING
        req.admitted = True
        self.running.append(req)
        self._order = None
        return True


def _guesses(
    drafts: dict[int, list[int]] | None, rows: np.ndarray, budget: int, size: int
) -> list[list[int]] | None:
    """The decodes' guesses in their order, or None when none has one. Over the token budget, each is cut
    to the longest length that fits them all (a row's first guesses are its likeliest to be accepted)."""
    if not drafts:
        return None
    guesses = [drafts.get(row, [])[: size - 1] for row in rows.tolist()]  # at most one new block a row
    room = budget - len(guesses)
    lengths = np.array([len(g) for g in guesses], np.int64)
    if lengths.sum() > room:
        cap = max((c for c in range(int(lengths.max())) if np.minimum(lengths, c).sum() <= room), default=0)
        guesses = [g[:cap] for g in guesses]
    return guesses if any(guesses) else None
