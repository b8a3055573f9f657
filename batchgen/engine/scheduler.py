"""Continuous batching over the paged KV cache: decodes first, then prefill chunks, preempt by recompute.

Pure Python: no torch. The scheduler may run one step ahead of the device (asynchronous mode): it counts
tokens sampled by in-flight steps as ``num_pending`` and never waits for their values. It keeps each
running request's row of the persistent batch (``rows.py``) in step with its blocks. A decode whose
block has room costs a few attribute updates (no property calls, no allocation): with hundreds of
decoding rows this loop is most of the host's time per step.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import NamedTuple

from batchgen.engine.block_manager import BlockManager
from batchgen.engine.request import Request, Status
from batchgen.engine.rows import RowState


class ScheduledItem(NamedTuple):
    request: Request
    start: int  # first position computed in this step
    num_tokens: int
    samples: bool  # the last position produces a token


class ScheduledStep(NamedTuple):
    """A step's sequences: the decodes first (one token each, always sampled: kept as bare requests and
    positions, the common case at hundreds of rows a step), then the items (prefill chunks)."""

    step_id: int
    items: list[ScheduledItem]
    decodes: Sequence[Request] = ()  # the scheduler appends to lists of its own
    decode_starts: Sequence[int] = ()  # each decode's position

    @property
    def num_seqs(self) -> int:
        return len(self.decodes) + len(self.items)

    def sampled(self) -> list[Request]:
        """The requests that sample, in the order of the step's sampled-token rows."""
        return [*self.decodes, *(item.request for item in self.items if item.samples)]


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
        elif req.status is Status.WAITING and req in self.waiting:
            self.waiting.remove(req)  # preempted, and its in-flight token ended it
        req.status = Status.FINISHED

    def clear(self) -> None:
        """Forget every request (an abandoned stream); the caller releases their blocks."""
        for req in self.running:
            self.rows.free(req)
        self.running.clear()
        self.waiting.clear()

    # --- one step ---------------------------------------------------------------------------------

    def schedule(self) -> ScheduledStep:
        step = ScheduledStep(self._next_step, [], [], [])
        budget, prefills = self._schedule_decodes(step, self.max_batch_tokens)
        for req in prefills:  # then chunks of prefills already under way
            if budget == 0 or step.num_seqs >= self.max_num_seqs:
                break
            if req.status is Status.RUNNING and self._reserve(req, budget, step.step_id):
                budget -= self._append(step, req, budget)
        self._admit(step, budget)
        if step.num_seqs:  # ids of launched steps are consecutive: carry-over refers to "the step before"
            self._next_step += 1
        return step

    def _schedule_decodes(self, step: ScheduledStep, budget: int) -> tuple[int, list[Request]]:
        """One token for each decoding request (the common case, inlined), in admission order, in the
        same pass that finds the prefills under way. Returns the budget left and those prefills."""
        decodes, starts, step_id = step.decodes, step.decode_starts, step.step_id
        size, max_seqs = self.blocks.block_size, self.max_num_seqs
        prefills, running = [], Status.RUNNING
        for req in self.running[:]:  # a copy: reserving a block may preempt (remove) a later request
            length = len(req.tokens) + req.num_pending
            if length - req.num_prompt >= req.max_tokens:
                continue  # its last token is already in flight
            pos = req.num_computed
            if length - pos != 1:
                prefills.append(req)
                continue
            if budget == 0 or len(decodes) >= max_seqs:
                break  # nothing more fits this step, prefills included
            if req.status is not running:  # preempted to make room for an earlier one
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
        return budget, prefills

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
        self.blocks.release(req)
        req.num_computed = 0
        req.status = Status.WAITING
        self.waiting.appendleft(req)
        self.num_preemptions += 1

    # --- admission --------------------------------------------------------------------------------

    def _admit(self, step: ScheduledStep, budget: int) -> None:
        held: list[Request] = []
        while self.waiting and budget > 0 and step.num_seqs < self.max_num_seqs:
            req = self.waiting[0]
            if not self._admissible(req):
                held.append(self.waiting.popleft())  # a sibling waiting for its row's prefill
                continue
            if not self._try_start(req, budget):
                break
            self.waiting.popleft()
            budget -= self._append(step, req, budget)
        self.waiting.extendleft(reversed(held))

    def _admissible(self, req: Request) -> bool:
        if req.num_pending:  # a preempted request whose last token is still in flight
            return False
        parent = req.parent
        return parent is None or parent.finished or parent.prefill_done

    def _try_start(self, req: Request, budget: int) -> bool:
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
        return True
