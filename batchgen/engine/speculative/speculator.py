"""The engine's speculation: guesses for a step's decoding rows, and what the verify step accepted.

No torch. A verify step is a decode step whose rows carry their guesses as extra query tokens: the batch
builder packs them like a prefill chunk and samples every position of the row (``batch.py``), each with
the row's own noise for that output index. A guess is accepted while it equals the token sampled at its
position, so the output is the one plain decoding gives, greedy or sampled, token for token: for a guess
that is one token (prompt lookup) this is the standard rejection rule, accepting the guess with its
probability under the target and otherwise drawing from the rest, with the draw fixed by the row's seed.
Rejected positions are rolled back by moving the row's computed count back, and in the asynchronous loop
the next verify step is built while this one runs, as if its guesses were accepted (accept.py).

Rows that speculate: those whose next tokens depend only on the model and the row's own seed. Penalised
rows (their counts would include guesses not yet accepted) and constrained rows (their masks follow the
grammar token by token) decode one token a step beside them; a step with a constrained row does not
speculate at all (its masks are filled per sampled row), and a constrained row starts in a plain step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from batchgen.engine.speculative.ngram import NgramProposer
from batchgen.engine.speculative.policy import PLAIN, VERIFY, WAITED, RowDrafts, SpecPolicy

if TYPE_CHECKING:
    from batchgen.engine.request import Request
    from batchgen.engine.stats import EngineStats

METHODS = ("ngram", "draft")
PREPARE_EVERY = 8  # a running row's new tokens are indexed by every this many calls of ``prepare``
# New rows' tokens (their prompts) that one call of ``prepare`` takes, at least one row: a wide batch's
# prompts joining at once are spread over the plain steps before the first verify step.
PREPARE_TOKENS = 16384


class Proposer(Protocol):
    """Guesses for a step's rows, all at once (a draft model or an EAGLE-style head runs one batched
    forward a guessed position). Each row's own state lives in its ``RowDrafts.state``. ``chains``: it can
    guess while a step is in flight, from tokens that end in guesses held as accepted (accept.py); else
    the loop waits for every step before a verify step, and for the verify step before the next."""

    chains: bool

    def propose(self, requests: list[Request], ks: list[int]) -> list[list[int]]:
        """Up to ``ks[i]`` guessed tokens to follow ``requests[i].tokens``, for each row (the last
        ``num_guessed`` of those tokens are guesses held as accepted: a chaining proposer's)."""
        ...

    def prepare(self, requests: list[Request]) -> None:
        """Work a later ``propose`` would otherwise do first (a row's prompt indexed), done while a plain
        step runs on the device. Every request has its ``RowDrafts``."""
        ...


class Speculator:
    def __init__(
        self, method: str, k_max: int, ngram_min: int, ngram_max: int, adaptive: bool = True,
        proposer: Proposer | None = None,  # a draft model's (draft.DraftProposer), for "draft"
    ) -> None:  # fmt: skip
        if method not in METHODS:
            raise ValueError(f"unknown speculative method {method!r} (supported: {', '.join(METHODS)})")
        if (method == "draft") != (proposer is not None):
            raise ValueError("--speculative draft, and only it, runs a draft model's proposer")
        self.k_max = k_max
        self.proposer: Proposer = proposer or NgramProposer(ngram_min, ngram_max)
        self.policy = SpecPolicy(k_max, adaptive)
        self._prepared = 0  # calls of ``prepare``

    def run_async(self, async_mode: bool) -> None:
        """The engine's loop: in the asynchronous one, verify steps chain if the proposer can (accept.py)."""
        self.policy.chained = async_mode and self.proposer.chains

    def wants(self, running: list[Request]) -> int:
        """The next step's kind (policy.py): PLAIN (0), or a verify step, which may wait (``waits``)."""
        return self.policy.speculate(len(running)) if running else PLAIN

    def waits(self, kind: int) -> bool:
        """Whether a step of ``kind`` verifies guesses and waits for every step in flight, whose tokens
        its guesses continue, with the next step waiting for it in turn (nothing chained, nothing voided)."""
        return kind == WAITED or (kind == VERIFY and not self.policy.chained)

    def prepare(self, running: list[Request]) -> None:
        """While a plain step runs: the rows' one-time proposal work (prompt lookup's index of a new row's
        prompt), so that the first verify step neither waits for it nor counts it in the policy's timing.
        Each call takes new rows up to PREPARE_TOKENS of their tokens and one in PREPARE_EVERY of the
        others (their tokens since), so that a wide batch's host work a plain step stays small. Rows that
        never guess (penalised, constrained) are left out."""
        self._prepared += 1
        phase, budget, rows = self._prepared % PREPARE_EVERY, PREPARE_TOKENS, []
        for i, req in enumerate(running):
            if req.params.penalized or req.guide is not None:
                continue
            if req.draft is None or req.draft.state is None:  # new to the proposer: its prompt
                if budget <= 0:
                    continue  # the next call's
                budget -= req.num_confirmed
            elif i % PREPARE_EVERY != phase:
                continue
            if req.draft is None:
                req.draft = RowDrafts(self.k_max)
            rows.append(req)
        self.proposer.prepare(rows)

    def drafts(self, running: list[Request]) -> dict[int, list[int]] | None:
        """Each decoding row's guesses, by its row of the persistent batch (rows without a guess left
        out); None: the step runs plain. A row whose input token a step in flight samples (one at most,
        and only with a chaining proposer) guesses past it: its proposal's first token stands for that
        one, and the rest follow it."""
        if any(req.guide is not None for req in running):
            return None
        rows, ks, skips = [], [], []
        for req in running:
            pending = req.num_pending
            if pending > 1 or len(req.tokens) + pending - req.num_computed != 1 or req.params.penalized:
                continue  # not decoding this step (a prefill under way), or penalised
            if req.draft is None:
                req.draft = RowDrafts(self.k_max)
            if req.num_confirmed < req.draft.rest_until:  # its guesses fail more often than not (policy.py)
                continue
            k = min(req.draft.k, req.max_tokens - req.sampled_scheduled - 1)  # the last one is never a guess
            if k > 0:
                rows.append(req)
                ks.append(k + pending)
                skips.append(pending)
        proposals = self.proposer.propose(rows, ks)
        guesses = {req.row: g[s:] for req, g, s in zip(rows, proposals, skips, strict=True) if len(g) > s}
        return guesses or None

    def accepted(self, req: Request, proposed: int, accepted: int, stats: EngineStats) -> None:
        """Account a verified row: the acceptance statistics and its next number of guesses."""
        stats.draft_tokens += proposed
        stats.accepted_tokens += accepted
        if req.draft is not None:
            self.policy.next_k(req.draft, proposed, accepted, req.num_confirmed)


def accepted_length(guess: list[int], sampled: list[int]) -> int:
    """How many leading guesses equal the tokens sampled at their positions (``sampled`` has one more
    entry than ``guess``: the token after the last guess)."""
    n = 0
    for want, got in zip(guess, sampled, strict=False):
        if want != got:
            break
        n += 1
    return n
