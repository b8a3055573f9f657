"""A draft model's guesses (``--speculative draft``): a small model with the target's tokenizer guesses each
row's next tokens greedily, one batched forward a guessed position, over its own paged KV (``draft_pool``).

A proposal round first catches every row up: the tokens the draft has not computed yet (the whole prompt
the first time, then the tokens accepted since) run as one packed extend step, up to the step's token
budget, and the logits after each row's last token give its first guess; each further guess is one decode
step over the rows that want it. The draft's argmax is only a guess: the target's verify step keeps it
where it equals the target's own draw, so the output never depends on the draft.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch

from batchgen.engine.speculative.draft_pool import DraftPool, DraftRow
from batchgen.model.backends import KernelBackend, PagedContext

if TYPE_CHECKING:
    from batchgen.engine.request import Request
    from batchgen.model.forward import ModelForward


class DraftModel(NamedTuple):
    """What ``rank_engine`` builds for a draft: its forward and KV pool, on the target's device."""

    forward: ModelForward
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]]
    backend: KernelBackend
    device: torch.device
    block_size: int
    max_model_len: int  # the draft's positions: a row longer than this guesses nothing
    tokenizer: Any  # checked against the target's (``same_tokenizer``)


class _Seq(NamedTuple):
    """One row's share of a draft forward: the positions [start, stop) it computes from ``tokens``."""

    row: DraftRow
    start: int
    stop: int
    tokens: list[int]  # its input tokens, stop - start of them (none: they are on the device)


class DraftProposer:
    """``speculator.Proposer`` over a draft model. ``vocab``: the target's logits width (a draft whose
    vocabulary is padded wider never guesses past it)."""

    # Its rows' KV holds the tokens it saw: guesses held as accepted (and rolled back after) would need a
    # second rollback, so verify steps with a draft model wait for each other.
    chains = False

    def __init__(self, model: DraftModel, vocab: int, max_tokens: int) -> None:
        self.model = model
        self.vocab = vocab
        self.max_tokens = max_tokens  # tokens of one catch-up forward
        self.pool = DraftPool(model.kv_caches[0][0].shape[0], model.block_size)

    def prepare(self, requests: list[Request]) -> None:
        """Nothing: the draft's catch-up is device work, which would compete with the step in flight."""

    @torch.inference_mode()
    def propose(self, requests: list[Request], ks: list[int]) -> list[list[int]]:
        self.pool.begin(requests)
        guesses: list[list[int]] = [[] for _ in requests]
        seqs, wanted = self._catch_up(requests, ks)
        if not seqs:
            return guesses
        complete = [s.stop == len(s.row.request.tokens) for s in seqs]
        steps = [self._run(seqs, complete)]  # [G_j] on the device: guess j of each row still guessing
        rows = [(i, seq.row, k) for (i, k), seq, done in zip(wanted, seqs, complete, strict=True) if done]
        for seq in seqs:
            seq.row.computed = seq.stop
        lives = [list(range(len(rows)))]  # per guess: the rows (indices into ``rows``) that made it
        for j in range(1, max((k for _, _, k in rows), default=0)):
            keep = [n for n, r in enumerate(lives[-1]) if rows[r][2] > j]
            ids = steps[-1]  # each row's previous guess is its input
            if len(keep) < len(ids):
                ids = ids[self._tensor(np.array(keep, np.int64))]
            lives.append([lives[-1][n] for n in keep])
            step = []
            for r in lives[-1]:
                at = len(rows[r][1].request.tokens) + j - 1  # where guess j's input (guess j - 1) goes
                step.append(_Seq(rows[r][1], at, at + 1, []))
            steps.append(self._run(step, [True] * len(step), ids))
        tokens = iter(torch.cat(steps).tolist())  # the round's one wait for the device
        for live in lives:
            for r in live:
                guesses[rows[r][0]].append(next(tokens))
        for i, row, _ in rows:
            row.ahead = guesses[i][:-1]  # the last guess's KV is never written
        return guesses

    def _catch_up(self, requests: list[Request], ks: list[int]) -> tuple[list[_Seq], list[tuple[int, int]]]:
        """Each row's uncomputed tokens, up to the token budget (a row cut short guesses nothing this
        round), with the blocks for them and for its guesses; and each one's (request index, guesses)."""
        seqs, wanted, budget = [], [], self.max_tokens
        for i, (req, k) in enumerate(zip(requests, ks, strict=True)):
            length = len(req.tokens)
            if budget <= 0 or length + k - 1 > self.model.max_model_len:
                continue
            row = self.pool.row(req)
            stop = min(length, row.computed + budget)
            if not self.pool.reserve(row, length + k - 1 if stop == length else stop):
                continue
            budget -= stop - row.computed
            seqs.append(_Seq(row, row.computed, stop, req.tokens[row.computed : stop]))
            wanted.append((i, k))
        return seqs, wanted

    def _run(self, seqs: list[_Seq], sample: list[bool], ids: torch.Tensor | None = None) -> torch.Tensor:
        """One draft forward over ``seqs`` (their tokens, or ``ids`` on the device: one a sequence); the
        argmax after the last token of each sampled one, [sampled] on the device."""
        counts = np.array([s.stop - s.start for s in seqs], np.int64)
        cu = np.zeros(len(seqs) + 1, np.int64)
        np.cumsum(counts, out=cu[1:])
        if ids is None:
            ids = self._tensor(np.fromiter((t for s in seqs for t in s.tokens), np.int64, int(cu[-1])))
        positions = np.concatenate([np.arange(s.start, s.stop) for s in seqs])
        slots = np.array([x for s in seqs for x in self.pool.slots(s.row, s.start, s.stop)], np.int64)
        width = max(len(s.row.blocks) for s in seqs)
        tables = np.zeros((len(seqs), width), np.int32)
        for b, s in enumerate(seqs):
            tables[b, : len(s.row.blocks)] = s.row.blocks
        picked = [b for b, want in enumerate(sample) if want]
        logits = self.model.forward(
            ids,
            self._tensor(positions),
            self._tensor(cu[1:][picked] - 1),
            self._context(slots, cu, counts, [s.stop for s in seqs], tables),
        )  # fmt: skip  [S, V]
        return logits[:, : self.vocab].argmax(-1)

    def _context(self, slots, cu, counts, seq_lens: list[int], tables) -> PagedContext:
        m = self.model
        return PagedContext(
            m.kv_caches, self._tensor(slots), self._tensor(cu.astype(np.int32)),
            self._tensor(np.array(seq_lens, np.int32)), self._tensor(tables), int(counts.max()),
            max(seq_lens), m.backend,
        )  # fmt: skip

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(array).to(self.model.device, non_blocking=True)


PROBE_TEXT = 'Speculative drafts must share the target\'s tokenizer: 12 345, été, 東京, </s> {"a": [1]}'


def same_tokenizer(target: Any, draft: Any) -> bool:
    """Whether the draft's token ids mean the target's (a probe text encodes alike)."""
    return target.encode(PROBE_TEXT, add_special_tokens=False) == draft.encode(
        PROBE_TEXT, add_special_tokens=False
    )
