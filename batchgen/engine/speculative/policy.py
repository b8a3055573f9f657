"""When speculation pays: measured, per batch width, never assumed.

A verify step computes K + 1 positions a row, and a rejected guess voids the row's part of the step
launched behind it (accept.py), so at a large width, or with guesses that fail, it costs more than it
gains. The policy times both kinds of step at each width (a power of two
of decoding rows; plain steps first) and runs the faster, timing the slower again now and then, less
often each time it stays slower: turning speculation on then costs the first probes where it cannot help,
and a share of steps that shrinks as the run goes on. A width next to one already measured (half or twice
its rows: a batch whose rows finish one by one passes through each) starts with that width's faster kind
and times the other only at its first probe: a width a run passes through for a few dozen steps would
otherwise spend most of them timing both.

Each row also proposes fewer tokens after its guesses fail (its ``RowDrafts.k``): one accepted guess out
of four costs three wasted positions a step. Where verify steps chain (accept.py), a rejected guess also
voids the row's part of the next step: with each guess accepted with probability a, guessing k tokens makes
(1 + a + ... + a^k) / (2 - a^k) tokens a step, above plain decoding's one exactly when a > 1/2. So a row
whose counted acceptance falls under one half sits out a few verify steps (more each time in a row).
"""

from __future__ import annotations

from dataclasses import dataclass, field

WINDOW = 8  # steps of one kind timed in a row when a width is new (the first of them pays the switch)
PROBE = 4  # steps of the slower kind timed again, now and then
EXPLOIT = 96  # steps of the faster kind before the first probe of the slower; doubled after each probe
MAX_EXPLOIT = 4096  # ... that confirms it, up to this
SMOOTHING = 0.25  # weight of a new window's rate in a kind's running rate
# A timed run of the slower kind ends after this many steps when it makes under this share of the other
# kind's rate: a verify step several times a plain one's cost (a wide batch) is not timed eight times.
EARLY_STEPS, EARLY_SHARE = 2, 0.5
# A row's accepted and rejected guesses count with this weight per verify step (its recent acceptance); under
# one half it sits out REST verify steps, twice as many each time in a row, up to MAX_REST.
DECAY, REST, MAX_REST = 0.8, 4, 64


@dataclass
class RowDrafts:
    """A request's speculation state: how many tokens it guesses, and its proposer's own (an n-gram
    index; None until the proposer first sees the row). ``waiting``: guesses of a launched verify step
    whose input token an earlier step in flight samples (held once that step is postprocessed: accept.py)."""

    k: int
    state: object = None
    waiting: list[int] | None = None
    hits: float = 0.0  # accepted guesses, decayed
    misses: float = 0.0  # verify steps that rejected a guess, decayed
    rest: int = 0  # verify steps left to sit out
    rest_len: int = 0  # the last rest's length (0: the row's last verify accepted every guess)

    @property
    def acceptance(self) -> float:
        """Its estimated chance that a guess is accepted (one half before any verify step)."""
        return (self.hits + 1) / (self.hits + self.misses + 2)


@dataclass
class _Width:
    """Both kinds of step at one batch width: their output rates (tokens/s) and the current run."""

    rate: dict[bool, float] = field(default_factory=dict)
    # each kind's tokens, seconds and steps since its rate was last updated
    window: dict[bool, list[float]] = field(
        default_factory=lambda: {True: [0.0, 0.0, 0], False: [0.0, 0.0, 0]}
    )
    speculate: bool = False  # the kind being run
    left: int = 0  # steps left in this run
    probing: bool = True
    confirmed: int = 0  # probes in a row that found the slower kind still slower
    inherited: bool | None = None  # the faster kind taken from a neighbouring width, until measured here


class SpecPolicy:
    """``speculate(rows)`` before a step; ``timed(rows, speculated, tokens, seconds)`` after it."""

    def __init__(self, k_max: int, adaptive: bool = True, chained: bool = False) -> None:
        self.k_max = k_max
        self.adaptive = adaptive
        self.chained = chained  # verify steps chain: a rejection voids the row's next step
        self._widths: dict[int, _Width] = {}

    def speculate(self, rows: int) -> bool:
        """Whether the next step with ``rows`` decoding rows verifies guesses."""
        if not self.adaptive:
            return True
        bucket = _bucket(rows)
        width = self._widths.get(bucket)
        if width is None:
            width = self._widths[bucket] = self._new_width(bucket)
        if width.left <= 0:
            self._next_run(width)
        width.left -= 1
        return width.speculate

    def _new_width(self, bucket: int) -> _Width:
        """A width's first run: its measured neighbour's faster kind, timed as it runs; without one, none
        (``_next_run`` times plain steps, then verify steps)."""
        width = _Width()
        for near in (self._widths.get(bucket // 2), self._widths.get(bucket * 2)):
            faster = None if near is None else _faster(near)
            if faster is not None:
                width.speculate, width.left, width.probing, width.inherited = faster, EXPLOIT, False, faster
                break
        return width

    def timed(self, rows: int, speculated: bool, tokens: int, seconds: float) -> None:
        """A decode step's output tokens and wall time (from the previous step's tokens to its own)."""
        width = self._widths.get(_bucket(rows))
        # a step of the other kind was decided under a neighbouring width's run (the rows changed between
        # the decision and the step): one such step, with its switch, is no measure of this width
        if width is None or seconds <= 0 or speculated != width.speculate:
            return
        sums = width.window[speculated]
        sums[0] += tokens
        sums[1] += seconds
        sums[2] += 1
        other = width.rate.get(not speculated)
        if width.probing and other and sums[2] >= EARLY_STEPS and sums[0] / sums[1] < EARLY_SHARE * other:
            width.left = 0  # clearly the slower kind: the run ends here

    def _next_run(self, width: _Width) -> None:
        """Close the run just ended (its rate joins the kind's) and pick the next: each kind is timed once
        first, then the faster runs long and the slower is timed again between."""
        for kind, (tokens, seconds, _) in width.window.items():
            if seconds > 0:
                rate = tokens / seconds
                old = width.rate.get(kind)
                width.rate[kind] = rate if old is None else (1 - SMOOTHING) * old + SMOOTHING * rate
                width.window[kind] = [0.0, 0.0, 0]
        unmeasured = [kind for kind in (False, True) if kind not in width.rate]  # plain first: it is free
        if unmeasured:
            width.speculate, width.left, width.probing = unmeasured[0], WINDOW, True
            return
        best = width.rate[True] >= width.rate[False]
        if width.probing:  # a probe ended: run the faster, longer each time a probe confirmed it
            width.confirmed = width.confirmed + 1 if best != width.speculate else 0
            exploit = min(MAX_EXPLOIT, EXPLOIT << max(0, width.confirmed - 1))
            width.speculate, width.left, width.probing = best, exploit, False
        else:  # time the slower again
            width.speculate, width.left, width.probing = not best, PROBE, True

    def next_k(self, drafts: RowDrafts, proposed: int, accepted: int) -> None:
        """A row's guesses after a verify: one more after all were accepted, else one past the accepted;
        with chained verify steps, a rest when its acceptance falls under one half."""
        if not proposed:
            return
        drafts.k = min(self.k_max, drafts.k + 1) if accepted == proposed else max(1, accepted + 1)
        if self.chained:
            drafts.hits = DECAY * drafts.hits + accepted
            drafts.misses = DECAY * drafts.misses + (accepted < proposed)
            if drafts.acceptance < 0.5:
                drafts.rest_len = min(MAX_REST, max(REST, 2 * drafts.rest_len))
                drafts.rest = drafts.rest_len
            elif accepted == proposed:
                drafts.rest_len = 0

    def summary(self) -> dict[str, dict[str, float]]:
        """Each width's measured rates (tokens/s), for the stats file."""
        return {
            str(bucket): {
                ("speculative" if kind else "plain"): round(rate, 1) for kind, rate in w.rate.items()
            }
            for bucket, w in sorted(self._widths.items())
        }


def _faster(width: _Width) -> bool | None:
    """Whether verify steps are the faster kind at ``width``: measured, or taken from its neighbour; None
    when neither."""
    if len(width.rate) == 2:
        return width.rate[True] >= width.rate[False]
    return width.inherited


def _bucket(rows: int) -> int:
    """The power of two at or above ``rows``."""
    return 1 << max(0, rows - 1).bit_length()
