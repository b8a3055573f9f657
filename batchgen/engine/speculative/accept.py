"""A verify step's sampled tokens -> its rows: the accepted guesses and the token after them, the rest
rolled back (engine/speculative/speculator.py says why the output is plain decoding's). No torch."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from batchgen.engine.speculative.speculator import accepted_length

if TYPE_CHECKING:
    from batchgen.engine.block_manager import BlockManager
    from batchgen.engine.request import Request
    from batchgen.engine.rows import RowState
    from batchgen.engine.runner_protocol import StepResult
    from batchgen.engine.scheduler import Decodes


class VerifiedRows:
    """Takes a verify step's decodes' tokens. ``take(req, row)`` appends sampled row ``row``'s token
    (and log-probabilities) to ``req``; ``check(req)`` ends a row that stopped (the engine's)."""

    def __init__(self, blocks: BlockManager, rows: RowState, eos_ids: list[int]) -> None:
        self.blocks, self.rows, self.eos_ids = blocks, rows, eos_ids

    def take(
        self, decodes: Decodes, result: StepResult, take: Callable[[Request, int], None],
        check: Callable[[Request], None], accepted: Callable[[Request, int, int], None],
    ) -> tuple[int, int]:  # fmt: skip
        """Each row keeps its accepted guesses and the token sampled after them (a stop ends it there);
        its computed count moves back past the rejected ones and their blocks are given back. Returns the
        tokens kept and the sampled rows the decodes used."""
        at = made = 0
        for req, start, guess in zip(decodes.requests, decodes.starts.tolist(), decodes.drafts, strict=True):
            sampled = result.tokens[at : at + len(guess) + 1]
            n = accepted_length(guess, sampled)
            req.num_pending -= 1
            req.num_computed = start + 1 + n
            if self.blocks.shrink(req, start + 2 + n):  # the next step writes position num_computed
                self.rows.trim_table(req)
            accepted(req, len(guess), n)
            if req.watched or req.logprobs is not None:
                made += self._one_by_one(req, range(at, at + n + 1), take, check)
            else:
                made += self._at_once(req, sampled[: n + 1], check)
            at += len(guess) + 1
        return made, at

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
        self.rows.known[req.row] += len(tokens)
        check(req)
        return len(tokens)
