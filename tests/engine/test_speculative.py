"""Speculative decoding in the engine, against plain decoding as the oracle: a model stand-in whose next
token is a pure function of the input token, its position and the row's sampling (so a verify step's
accepted positions must give what plain decoding gives), mostly copying a cycle (so prompt lookup guesses
right often, and wrong where the position breaks the cycle). The engine runs with and without guesses
through preemption, chunked prefills, stops, length limits, sibling samples and the asynchronous loop;
the completions must be identical and every block released."""

from __future__ import annotations

import numpy as np
import pytest

from batchgen.config import SamplingParams
from batchgen.engine.block_manager import BlockManager
from batchgen.engine.completions import GenerationRequest
from batchgen.engine.engine import Engine
from batchgen.engine.scheduler import Scheduler
from batchgen.engine.speculative.speculator import Speculator
from batchgen.engine.stops import StopChecker
from tests.engine.scheduler_cases import EOS, VOCAB, Letters, Recorder

BREAK_EVERY = 11  # positions where the stand-in leaves its cycle: guesses there are rejected


class Copier(Recorder):
    """Next token = a fixed permutation of the input token (a cycle prompt lookup can follow), except at
    every ``break_every``-th position; sampled rows shift it by their key. Records each step's inputs and
    checks the persistent batch against the running requests, as ``Recorder`` does."""

    break_every = BREAK_EVERY

    def __init__(self, scheduler: Scheduler) -> None:
        super().__init__(scheduler)
        self.perm = np.random.default_rng(0).permutation(np.arange(3, VOCAB))  # never EOS (2) by the cycle

    def tokens(self, inputs, ids: np.ndarray) -> np.ndarray:
        rows = inputs.logits_indices
        token, pos = ids[rows], inputs.positions[rows]
        shift = np.where(inputs.temperature > 0, inputs.rng_keys % 3, 0)
        cycle = self.perm[(token + shift) % len(self.perm)]
        return np.where(pos % self.break_every == 0, (token * 7 + pos) % VOCAB, cycle)


def _rows(count: int, seed: int) -> list[GenerationRequest]:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(count):
        params = SamplingParams(
            max_new_tokens=int(rng.integers(1, 60)),
            temperature=float(rng.choice([0.0, 0.0, 0.8])),
            ignore_eos=bool(rng.random() < 0.7),
            stop=("qk",) if rng.random() < 0.2 else (),
            n=int(rng.choice([1, 1, 2])),
            logprobs=bool(rng.random() < 0.3),
            repetition_penalty=1.3 if rng.random() < 0.15 else 1.0,
            seed=i,
        )
        rows.append(GenerationRequest(i, rng.integers(3, VOCAB, int(rng.integers(2, 40))).tolist(), params))
    return rows


def _run(
    case: tuple[int, int, int], async_mode: bool, speculate: bool, k: int = 4, adaptive: bool = False,
    copier: type[Copier] = Copier, rows: list[GenerationRequest] | None = None,
):  # fmt: skip
    num_blocks, max_num_seqs, max_batch_tokens = case
    blocks = BlockManager(num_blocks, block_size=8)  # guesses stay under a block
    scheduler = Scheduler(blocks, max_num_seqs, max_batch_tokens)
    runner = copier(scheduler)
    speculator = Speculator("ngram", k, 1, 3, adaptive=adaptive) if speculate else None
    stops = StopChecker(Letters(), {EOS})
    engine = Engine(runner, blocks, scheduler, stops, 256, async_mode=async_mode, speculator=speculator)
    rows = _rows(50, max_num_seqs) if rows is None else rows
    outs = sorted(tuple(o) for o in engine.stream(rows, detokenize=True))  # rows end sooner
    assert blocks.num_free == num_blocks, "every block is released"
    return outs, runner.steps, engine.stats


# (num_blocks, max_num_seqs, max_batch_tokens): roomy; preempting; a token budget that cuts prompts
# and leaves some steps no room for every row's guesses.
CASES = [(400, 16, 256), (40, 12, 96), (400, 8, 20)]


def _chained(step: dict) -> bool:
    """A verify step launched while the step before ran: some input token carried over from it."""
    return len(step["logits_indices"]) > len(step["seq_lens"]) and bool((step["carry_rows"] >= 0).any())


@pytest.mark.parametrize("async_mode", [False, True])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("k", [2, 7])
def test_verified_guesses_give_plain_decoding_output(case, async_mode, k):
    want, _, plain = _run(case, async_mode, speculate=False)
    got, steps, stats = _run(case, async_mode, speculate=True, k=k)
    assert got == want
    assert stats.verify_steps > 0 and 0 < stats.accepted_tokens < stats.draft_tokens  # some of each
    if not async_mode:  # (chained, a rejection also voids a row's next step: guesses here fail too often)
        assert stats.steps < plain.steps  # accepted guesses saved steps
    else:  # verify steps launched behind another, and rejections that voided a row's part of the next
        assert any(_chained(s) for s in steps)
        assert stats.void_rows > 0
    if case[0] < 100:
        assert stats.preemptions > 0
    if case[2] < 30:
        assert stats.partial_prefills > 0
    verify = [s for s in steps if len(s["logits_indices"]) > len(s["seq_lens"])]
    assert verify
    for s in verify:  # a row's sampled positions draw consecutive output indices, as plain decoding would
        seq = np.searchsorted(s["cu_seqlens_q"], s["logits_indices"], side="right") - 1  # [S]
        assert np.bincount(seq).max() <= k + 1
        same = seq[1:] == seq[:-1]
        assert same.any()
        np.testing.assert_array_equal(np.diff(s["rng_steps"])[same], 1)
        np.testing.assert_array_equal(np.diff(s["logits_indices"])[same], 1)


class LongCopier(Copier):
    break_every = 41


def _walks(count: int, seed: int, perm: np.ndarray) -> list[GenerationRequest]:
    """Greedy rows (and a few sampled ones) whose prompts walk the stand-in's cycle: guesses mostly hold."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(count):
        walk = [int(rng.integers(3, VOCAB))]
        while len(walk) < int(rng.integers(20, 60)):
            walk.append(int(perm[walk[-1] % len(perm)]))
        params = SamplingParams(
            max_new_tokens=int(rng.integers(20, 90)), temperature=0.8 if i % 5 == 4 else 0.0,
            ignore_eos=True, logprobs=i % 7 == 3, seed=i,
        )  # fmt: skip
        rows.append(GenerationRequest(i, walk, params))
    return rows


@pytest.mark.parametrize("case", CASES)
def test_chained_verify_steps_save_steps_where_guesses_mostly_hold(case):
    """Asynchronous loop: each verify step is launched while the one before runs, as if that one's guesses
    were all accepted. Where guesses mostly hold, that saves steps over plain decoding; the rejections
    void a row's part of the step behind and the output stays plain decoding's."""
    perm = np.random.default_rng(0).permutation(np.arange(3, VOCAB))  # Copier's
    rows = _walks(40, 3, perm)
    want, _, plain = _run(case, True, speculate=False, copier=LongCopier, rows=rows)
    got, steps, stats = _run(case, True, speculate=True, k=4, copier=LongCopier, rows=rows)
    assert got == want
    assert stats.acceptance_rate > 0.7 and stats.void_rows > 0
    assert sum(map(_chained, steps)) > stats.verify_steps // 2
    assert stats.steps < 0.75 * plain.steps


@pytest.mark.parametrize("case", CASES)
def test_the_adaptive_policy_between_plain_and_verify_steps_keeps_the_output(case, monkeypatch):
    """The policy switching kinds every few steps (plain steps, verify steps chained behind the step in
    flight, verify steps that wait; rows' prompts indexed while plain steps run): output unchanged, every
    kind of step ran."""
    from batchgen.engine.speculative import ngram, policy

    monkeypatch.setattr(policy, "WINDOW", 2)
    monkeypatch.setattr(policy, "EXPLOIT", 3)
    monkeypatch.setattr(policy, "PROBE", 2)
    prepared = []
    monkeypatch.setattr(
        ngram.NgramIndex, "catch_up", lambda self, tokens, known: prepared.append(self._index(tokens, known))
    )
    want, _, _ = _run(case, True, speculate=False)
    got, _, stats = _run(case, True, speculate=True, adaptive=True)
    assert got == want
    assert 0 < stats.verify_steps < stats.steps and prepared
    # chained verify steps, waited ones and plain steps were all timed (at some width)
    assert any(len(rates) == 3 for rates in stats.speculation_rates.values()), stats.speculation_rates


def test_penalised_rows_guess_nothing():
    """Their penalty counts would include guesses not accepted yet: they decode one token a step."""
    _, steps, stats = _run(CASES[0], False, speculate=True)
    assert stats.verify_steps > 0
    penalised_seen = 0
    for s in steps:
        seq = np.searchsorted(s["cu_seqlens_q"], s["logits_indices"], side="right") - 1  # [S]
        samples = np.bincount(seq)[seq]  # [S] how many rows its sequence samples
        penalised = s["repetition_penalty"] != 1
        assert (samples[penalised] == 1).all()
        penalised_seen += int(penalised.sum())
    assert penalised_seen > 0
