"""The parts of speculative decoding on their own: prompt lookup, the acceptance rule, rows' guesses and
rests, giving back the blocks of rejected guesses, and the proposer's preparation (the policy:
test_speculative_policy.py)."""

from __future__ import annotations

import pytest

from batchgen.config import EngineConfig, SamplingParams
from batchgen.engine.block_manager import BlockManager
from batchgen.engine.request import Request
from batchgen.engine.speculative import policy as policy_module
from batchgen.engine.speculative.ngram import NgramIndex
from batchgen.engine.speculative.policy import RowDrafts, SpecPolicy
from batchgen.engine.speculative.speculator import accepted_length


def _naive(tokens: list[int], k: int, n_min: int, n_max: int) -> list[int]:
    """Prompt lookup by scanning: the newest earlier copy of the longest suffix, its next k tokens."""
    for n in range(min(n_max, len(tokens) - 1), n_min - 1, -1):
        suffix = tokens[-n:]
        for end in range(len(tokens) - 1, n - 1, -1):  # the copy ends before position `end`
            if tokens[end - n : end] == suffix:
                return tokens[end : end + k]
    return []


def test_lookup_follows_the_newest_copy_of_the_longest_suffix():
    index = NgramIndex(1, 3)
    tokens = [1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3]
    # "2 3" last seen before 7: the 3-gram "5 2 3" never, so the 2-gram's newest copy wins
    assert index.propose(tokens, 3) == [7, 8, 5]
    assert index.propose([4, 5, 6], 2) == []  # no n-gram seen twice (a fresh index of another row)


@pytest.mark.parametrize("seed", range(20))
def test_incremental_index_equals_a_full_scan(seed):
    """The row grows by one to three tokens between lookups, as accepted guesses do, and now and then by
    dozens (a row prepared every few steps; a prompt): both of ``NgramIndex._index``'s paths."""
    import random

    rng = random.Random(seed)
    tokens = [rng.randrange(6) for _ in range(8 if seed % 2 else 40)]
    index = NgramIndex(2, 4)
    for _ in range(60):
        assert index.propose(tokens, 4) == _naive(tokens, 4, 2, 4), tokens
        grow = rng.choice([1, 2, 3, 1, 2, 3, 17, 30])
        tokens += [rng.randrange(6) for _ in range(grow)]


def test_accepted_length_stops_at_the_first_difference():
    assert accepted_length([5, 6, 7], [5, 6, 7, 8]) == 3
    assert accepted_length([5, 6, 7], [5, 9, 7, 8]) == 1
    assert accepted_length([5], [4, 1]) == 0
    assert accepted_length([], [3]) == 0


def test_rows_guess_less_after_rejections_and_more_after_full_acceptance():
    policy = SpecPolicy(k_max=5)
    drafts = RowDrafts(5)
    policy.next_k(drafts, proposed=5, accepted=1)
    assert drafts.k == 2
    policy.next_k(drafts, proposed=2, accepted=0)
    assert drafts.k == 1
    policy.next_k(drafts, proposed=1, accepted=1)
    assert drafts.k == 2
    policy.next_k(drafts, proposed=0, accepted=0)  # no guess this step: nothing learnt
    assert drafts.k == 2


def test_guesses_over_the_token_budget_are_cut_to_the_longest_length_that_fits():
    """Eight decodes of one to four guesses under a 22-token step: each keeps its first guesses, no more
    than any other's cut (a whole plain step instead would verify nothing)."""
    import numpy as np

    from batchgen.engine.scheduler import _guesses

    rows = np.arange(8)
    drafts = {row: [row, row + 1, row + 2, row + 3][: 1 + row % 4] for row in range(8)}  # lengths 1-4
    cut = _guesses(drafts, rows, budget=22, size=16)
    assert [len(g) for g in cut] == [1, 2, 2, 2, 1, 2, 2, 2]  # 8 inputs + 14 guesses
    assert [len(g) for g in _guesses(drafts, rows, budget=21, size=16)] == [1] * 8
    assert all(g == drafts[row][: len(g)] for row, g in enumerate(cut))
    assert _guesses(drafts, rows, budget=28, size=16) == list(drafts.values())  # all fit: uncut
    assert _guesses(drafts, rows, budget=8, size=16) is None  # no room for one: a plain step


def test_chained_rows_keep_guessing_every_token_they_may():
    """Where a rejection voids the row's next step, fewer guesses save no step: above one half's
    acceptance, (1 + a + ... + a^k) / (2 - a^k) tokens a step grows with k."""
    policy, drafts = SpecPolicy(k_max=5, chained=True), RowDrafts(5)
    for proposed, accepted in ((5, 3), (5, 4), (5, 2), (5, 5)):
        policy.next_k(drafts, proposed, accepted)
        assert drafts.k == 5 and drafts.rest_until == 0
    rate = [sum(0.8**i for i in range(k + 1)) / (2 - 0.8**k) for k in range(1, 6)]
    assert rate == sorted(rate)


def test_chained_rows_rest_while_their_guesses_fail_more_often_than_not():
    """Where verify steps chain, a rejection also voids the row's next step: a row whose counted
    acceptance is under one half sits out its next tokens, twice as many each time in a row, until a
    verify accepts everything; with unchained verify steps it never rests."""
    rest = policy_module.REST
    policy, drafts = SpecPolicy(k_max=4, chained=True), RowDrafts(4)
    policy.next_k(drafts, proposed=4, accepted=0, length=30)  # acceptance 1/3 (one half before any verify)
    assert drafts.acceptance < 0.5 and drafts.rest_until == 30 + rest
    policy.next_k(drafts, proposed=1, accepted=0, length=40)  # its probe after the rest failed too
    assert drafts.rest_until == 40 + 2 * rest
    for length in (50, 55, 60, 65):
        policy.next_k(drafts, proposed=2, accepted=2, length=length)
    assert drafts.acceptance > 0.5 and drafts.rest_len == 0
    policy.next_k(drafts, proposed=4, accepted=3, length=70)  # rejected, but accepted more often than not
    assert drafts.rest_until == 40 + 2 * rest
    unchained, other = SpecPolicy(k_max=4), RowDrafts(4)
    for _ in range(3):
        unchained.next_k(other, proposed=4, accepted=0, length=30)
    assert other.rest_until == 0


def test_a_resting_row_guesses_nothing_until_its_rest_ends():
    from batchgen.engine.speculative.speculator import Speculator

    class Row:  # a decoding row: its input token known, nothing in flight
        tokens, num_pending, num_computed, num_prompt, max_tokens, guide, row = (
            [5, 6, 5, 6, 5],
            0,
            4,
            2,
            50,
            None,
            0,
        )
        params = SamplingParams()
        draft = RowDrafts(4, rest_until=7)
        num_confirmed = 5
        sampled_scheduled = 3

    speculator = Speculator("ngram", 4, 1, 3)
    row = Row()
    assert speculator.drafts([row]) is None  # 5 tokens: resting until 7, however many steps ask
    assert speculator.drafts([row]) is None
    row.tokens = [5, 6, 5, 6, 5, 6, 5]  # two plain steps later
    row.num_computed, row.num_confirmed, row.sampled_scheduled = 6, 7, 5
    assert speculator.drafts([row]) == {0: [6, 5]}  # what followed the newest copy of (5, 6, 5)


def test_shrink_gives_back_the_tail_blocks_first_in_line():
    blocks = BlockManager(8, block_size=4)
    req = Request(0, 0, 0, None, SamplingParams(), list(range(5)), 5, 16, 1)
    blocks.grow(req, 13)  # four blocks
    returned = req.block_table[2:]
    blocks.shrink(req, 6)  # positions 0..5: two blocks
    assert len(req.block_table) == 2 and blocks.num_free == 6
    other = Request(1, 1, 0, None, SamplingParams(), [1], 1, 16, 1)
    blocks.grow(other, 1)
    assert other.block_table[0] in returned  # handed out before blocks whose cached content may be found


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(speculative="draft"), "--speculative draft and --draft-model PATH go together"),
        (dict(speculative="draft", draft_model="x", tensor_parallel=2), "must be 1"),
        (dict(speculative="medusa"), "unknown speculative method"),
        (dict(speculative="ngram", num_speculative_tokens=16), "block_size - 1 = 15"),
        (dict(speculative="ngram", ngram_min=3, ngram_max=2), "ngram_min <= ngram_max"),
        (dict(draft_model="x"), "go together"),
        (dict(speculative="ngram", draft_model="x"), "go together"),
    ],
)
def test_config_refuses_what_cannot_run(options, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**options)


class _Row:
    """What ``Speculator.prepare`` reads of a request."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens, self.draft, self.guide, self.params = tokens, None, None, SamplingParams()

    @property
    def num_confirmed(self) -> int:
        return len(self.tokens)


def test_prepare_indexes_new_rows_at_once_and_the_others_in_turn():
    """Behind plain steps: a new row's prompt is indexed by the next call; a running row's new tokens by
    one call in PREPARE_EVERY (a wide batch's host work a step stays small, and no row lags far)."""
    from batchgen.engine.speculative.speculator import PREPARE_EVERY, Speculator

    speculator = Speculator("ngram", 4, 1, 3)
    rows = [_Row(list(range(i, i + 40))) for i in range(3 * PREPARE_EVERY)]
    speculator.prepare(rows)
    assert all(row.draft.state.indexed == 40 for row in rows)
    for row in rows:
        row.tokens += [7, 8, 9]
    speculator.prepare(rows)
    assert sum(row.draft.state.indexed == 43 for row in rows) == 3  # one in PREPARE_EVERY
    for _ in range(PREPARE_EVERY - 1):
        speculator.prepare(rows)
    assert all(row.draft.state.indexed == 43 for row in rows)


def test_prepare_spreads_a_wide_batchs_new_prompts_over_calls(monkeypatch):
    """New rows' prompts beyond PREPARE_TOKENS a call wait for the next calls (each takes at least one row):
    a wide batch joining at once is indexed over the plain steps before its first verify step."""
    from batchgen.engine.speculative import speculator as speculator_module

    monkeypatch.setattr(speculator_module, "PREPARE_TOKENS", 100)

    speculator = speculator_module.Speculator("ngram", 4, 1, 3)
    rows = [_Row(list(range(i, i + 40))) for i in range(8)]
    indexed = []
    for _ in range(4):
        speculator.prepare(rows)
        indexed.append(sum(row.draft is not None and row.draft.state is not None for row in rows))
    assert indexed == [3, 6, 8, 8]  # 40-token prompts: the third row a call takes it past 100 tokens
