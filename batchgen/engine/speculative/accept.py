"""A verify step's guesses held in its rows, and its sampled tokens -> its rows: the accepted guesses and
the token after them kept, the rest rolled back (engine/speculative/speculator.py says why the output is
plain decoding's). No torch.

Verify steps chain like plain decode steps in the asynchronous loop: while step N runs, step N+1 is built
as if every guess of N were accepted. A row's guesses are held at the end of its tokens from the moment the
token before them is known (at N's launch, or once the step sampling that token is postprocessed), so the
scheduler, the batch builder and the proposer see the row as having them; its next input token is the one
N samples after its last guess, carried over on the device. When N rejects a row's guess, that row's part
of N+1 continued tokens it never had: it is void (``Request.void_step``: no tokens taken from it), and the
row's next step starts again from the token N sampled at the rejection. Rejected positions are rolled back
by moving the row's computed count back; their KV slots are written again by later steps (no copies), and
blocks past them return to the free list (a void step still writing to one runs before any new owner's).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from batchgen.engine.request import Status
from batchgen.engine.speculative.speculator import accepted_length

if TYPE_CHECKING:
    from batchgen.engine.block_manager import BlockManager
    from batchgen.engine.request import Request
    from batchgen.engine.rows import RowState
    from batchgen.engine.runner_protocol import StepResult
    from batchgen.engine.scheduler import Decodes


class VerifiedRows:
    """``hold`` a launched verify step's guesses; ``take`` its sampled tokens once it is done (``take(req,
    row)`` appends sampled row ``row``'s token and log-probabilities to ``req``; ``check(req)`` ends a row
    that stopped: the engine's); ``hold_waiting`` a row whose guesses waited for the step before."""

    def __init__(self, blocks: BlockManager, rows: RowState, eos_ids: list[int]) -> None:
        self.blocks, self.rows, self.eos_ids = blocks, rows, eos_ids
        self.voided = 0  # rows whose part of a later step became void

    def hold(self, decodes: Decodes) -> list[Request]:
        """Hold the guesses of rows whose input token is known; park the others' in ``RowDrafts`` until
        the step sampling that token is postprocessed (returned: ``hold_waiting`` them then)."""
        known = (self.rows.known[decodes.rows] > decodes.starts).tolist()  # before any is held
        waiting = []
        for req, guess, is_known in zip(decodes.requests, decodes.drafts, known, strict=True):
            if guess and is_known:
                self._extend(req, guess)
            elif guess:
                req.draft.waiting = guess
                waiting.append(req)
        return waiting

    def hold_waiting(self, req: Request) -> None:
        """The token before ``req``'s parked guesses is known now: hold them (unless the step guessing them
        became void, or the row ended)."""
        guess, req.draft.waiting = req.draft.waiting, None
        if guess and req.status is Status.RUNNING:
            self._extend(req, guess)

    def take(
        self, step_id: int, decodes: Decodes, result: StepResult, take: Callable[[Request, int], None],
        check: Callable[[Request], None], accepted: Callable[[Request, int, int], None],
    ) -> tuple[int, int]:  # fmt: skip
        """Each row keeps its accepted guesses and the token sampled after them (a stop ends it there);
        its computed count moves back past the rejected ones and their blocks are given back. Returns the
        tokens kept and the sampled rows the decodes used."""
        at = made = 0
        for req, start, guess in zip(decodes.requests, decodes.starts.tolist(), decodes.drafts, strict=True):
            first, at = at, at + len(guess) + 1  # its sampled rows
            sampled = result.tokens[first:at]
            if req.void_step == step_id:  # it continued guesses rejected since: nothing to take
                continue
            req.num_pending -= 1
            if req.status is Status.FINISHED:  # ended by the step before: past its end
                continue
            self._drop_held(req)  # taken again below, as far as they were accepted
            n = accepted_length(guess, sampled)
            accepted(req, len(guess), n)
            if n < len(guess) and req.row >= 0:
                self._roll_back(req, step_id, start + 1 + n)
            if req.watched or req.logprobs is not None:
                made += self._one_by_one(req, range(first, first + n + 1), take, check)
            else:
                made += self._at_once(req, sampled[: n + 1], check)
        return made, at

    def _roll_back(self, req: Request, step_id: int, computed: int) -> None:
        """Positions from ``computed`` on held rejected guesses. A later step in flight that continued
        them becomes void for this row; blocks past the next position return."""
        req.num_computed = computed
        if req.last_step > step_id:
            req.void_step = req.last_step
            req.num_pending -= 1
            self.voided += 1
            req.draft.waiting = None
        if self.blocks.shrink(req, computed + 1):  # the next step writes position ``computed``
            self.rows.trim_table(req)

    def _extend(self, req: Request, guess: list[int]) -> None:
        req.tokens.extend(guess)
        req.num_guessed = len(guess)
        if req.row >= 0:
            self.rows.known[req.row] += len(guess)

    def _drop_held(self, req: Request) -> None:
        held = req.num_guessed
        if held:
            del req.tokens[-held:]
            req.num_guessed = 0
            if req.row >= 0:
                self.rows.known[req.row] -= held

    @staticmethod
    def _one_by_one(req: Request, rows: range, take, check) -> int:
        """Stop strings, min_tokens, a grammar, log-probabilities: each token taken and checked."""
        for i, row in enumerate(rows, 1):
            take(req, row)
            check(req)
            if req.finished:
                return i
        return len(rows)

    def _at_once(self, req: Request, tokens: list[int], check) -> int:
        """A row only EOS or its length can end: its tokens up to the first EOS and within its length
        extended at once, then checked once (the last token kept is the only one that may end it)."""
        if not req.params.ignore_eos:
            for i, token in enumerate(tokens):
                if token in self.eos_ids:
                    tokens = tokens[: i + 1]
                    break
        tokens = tokens[: req.max_tokens - req.num_output]
        req.tokens.extend(tokens)
        if req.row >= 0:
            self.rows.known[req.row] += len(tokens)
        check(req)
        return len(tokens)
