"""Prompt lookup: guess a row's next tokens by finding its newest n-gram earlier in its prompt + output.

A row's index maps each n-gram (n from ``n_min`` to ``n_max``) to the position of the token that last
followed it; it grows with the row's tokens, so a lookup costs the same at the 10th token as at the 10 000th
(a scan of the whole sequence every step would grow with it). The newest occurrence is preferred: text
being copied continues where it was last seen.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from batchgen.engine.request import Request


BULK = 16  # positions from which ``_index`` takes the whole-slice path (below it, one position at a time)


class NgramIndex:
    """One row's n-gram positions, built incrementally from its token list."""

    def __init__(self, n_min: int, n_max: int) -> None:
        self.n_min, self.n_max = n_min, n_max
        self._next: dict[tuple[int, ...], int] = {}  # n-gram -> position of the token after its newest copy
        self._indexed = 0  # positions whose preceding n-grams are in ``_next``

    @property
    def indexed(self) -> int:
        return self._indexed

    def catch_up(self, tokens: list[int], known: int | None = None) -> None:
        """Index every known position now (``propose`` would first)."""
        self._index(tokens, len(tokens) if known is None else known)

    def _index(self, tokens: list[int], known: int) -> None:
        """Register the n-gram ending just before each of the first ``known`` positions not yet indexed
        (the suffix being looked up is never its own match: nothing follows it yet). Guesses held past
        ``known`` may be rolled back: never indexed. Many positions at once (a prompt) are indexed one n
        at a time with the loops in C: a wide batch's new prompts are indexed between two steps."""
        start = max(self._indexed, 1)
        if known - start < BULK:
            for pos in range(start, known):
                for n in range(self.n_min, min(self.n_max, pos) + 1):
                    self._next[tuple(tokens[pos - n : pos])] = pos
        else:  # positions ascend: a later copy of an n-gram replaces an earlier one, as above
            for n in range(self.n_min, self.n_max + 1):
                first = max(start, n)
                grams = zip(*(tokens[first - n + i : known - n + i] for i in range(n)), strict=True)
                self._next.update(zip(grams, range(first, known), strict=True))
        self._indexed = max(self._indexed, known)

    def propose(self, tokens: list[int], k: int, known: int | None = None) -> list[int]:
        """Up to ``k`` tokens that followed the newest earlier copy of the longest matching suffix
        (n from ``n_max`` down to ``n_min``); [] when no suffix has been seen before. Only the first
        ``known`` tokens are indexed (all by default); the suffix may end in guesses."""
        if k <= 0:
            return []
        self._index(tokens, len(tokens) if known is None else known)
        length = len(tokens)
        for n in range(min(self.n_max, length - 1), self.n_min - 1, -1):
            at = self._next.get(tuple(tokens[length - n :]))
            if at is not None:
                return tokens[at : at + k]
        return []


class NgramProposer:
    """Prompt lookup for a step's rows (``speculator.Proposer``): each row's index lives in its
    ``RowDrafts.state``, made on its first guess or by ``prepare``."""

    chains = True  # a lookup only reads the row's tokens, guesses held as accepted included

    def __init__(self, n_min: int, n_max: int) -> None:
        self.n_min, self.n_max = n_min, n_max

    def _index(self, req: Request) -> NgramIndex:
        if req.draft.state is None:
            req.draft.state = NgramIndex(self.n_min, self.n_max)
        return req.draft.state

    def propose(self, requests: list[Request], ks: list[int]) -> list[list[int]]:
        pairs = zip(requests, ks, strict=True)
        return [self._index(req).propose(req.tokens, k, req.num_confirmed) for req, k in pairs]

    def prepare(self, requests: list[Request]) -> None:
        """Index each row's tokens so far (a new row's prompt: hundreds; a running one's: a few)."""
        for req in requests:
            self._index(req).catch_up(req.tokens, req.num_confirmed)
