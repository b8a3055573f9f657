"""When speculation pays: measured, per batch width, never assumed.

A verify step computes K + 1 positions a row, and a rejected guess voids the row's part of the step launched
behind it (accept.py), so at a large width, or with guesses that fail, it costs more than it gains. Where
verify steps can chain there is a third kind: verify steps that wait (nothing voided, but the host's work
between them not hidden: at a few rows, where that work is small, they can be the fastest). The policy times
each kind of step at each width (a power of two of decoding rows; plain steps first) and runs the fastest,
timing the slower ones again now and then (the one timed longest ago), less often each time they stay
slower: turning speculation on then costs the first probes where it cannot help, and a share of steps that
shrinks as the run goes on. A kind's rate is its newest timing, not an average over the run: rows'
acceptance moves as they go (an answer's opening copies less of its prompt than its body), and a rate timed
in one phase must not outvote a probe in the next. Every step also slows as the rows' contexts grow, so
kinds timed at different times are compared as ratios: a long run's rate is its last steps', and the rates
of the kinds not run meanwhile move with it: by its step time's change (every kind's steps slow alike), and
for verify kinds also by its tokens a step's (the rows' acceptance, which plain steps do not have). A width
next to one already measured (half or twice its rows: a batch whose rows finish one by one passes through
each) starts with that width's fastest kind and times the others only at its probes: a width a run passes
through for a few dozen steps would otherwise spend most of them timing every kind.

Where verify steps wait for each other, a row proposes fewer tokens after its guesses fail (its
``RowDrafts.k``): one accepted guess out of four costs three wasted positions a step. Where they chain
(accept.py), a rejected guess also voids the row's part of the next step: with each guess accepted with
probability a, guessing k tokens makes (1 + a + ... + a^k) / (2 - a^k) tokens a step. Above one half that
grows with k (the void costs a step however many guesses were made), under it it shrinks and stays below
plain decoding's one. So a chained row guesses all K tokens it may, and a row whose counted acceptance falls
under one half sits out its next few tokens instead (more each time in a row). A rest is counted in the
row's tokens, not in verify steps: a row that rested through a run of plain steps guesses at the next
verify step, so a probe of verify steps measures rows that guess, not rows still resting from an earlier
phase of their answers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

WINDOW = 8  # steps of one kind run to time it when a width is new
PROBE = 6  # steps of a slower kind run to time it again, now and then
EXPLOIT = 96  # steps of the fastest kind before the first probe of a slower one; doubled after each probe
MAX_EXPLOIT = 4096  # ... that confirms it, up to this
# A run's first steps after the kind changed are not timed: chained verify steps behind a plain one start
# with no guesses known, and a plain step behind a verify one waits for its tokens. A timed run lasts until
# its other steps are timed (they come back a step or two after the next ones are decided), up to LAG more.
TRANSIENT, LAG = 2, 16
# A timed run of a slower kind ends after this many steps when it makes under this share of the fastest
# other kind's rate: each step of a probe that loses costs its share of a step, and a verify step several
# times a plain one's cost (a wide batch) is not timed eight times. Two steps past the switch's transient
# ones time a kind well enough to see it clearly slower.
EARLY_STEPS, EARLY_SHARE = 2, 0.8
# Verify steps that wait are not timed where chained ones make under this share of plain's rate: waiting
# for each other cannot save them.
FAR_SHARE = 0.5
# A row's accepted and rejected guesses count with this weight per verify step (its recent acceptance); under
# one half it sits out its next REST tokens, twice as many each time in a row, up to MAX_REST.
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
    rest_until: int = 0  # the row's confirmed tokens (prompt and output) up to which it guesses nothing
    rest_len: int = 0  # the last rest's length (0: the row's last verify accepted every guess)

    @property
    def acceptance(self) -> float:
        """Its estimated chance that a guess is accepted (one half before any verify step)."""
        return (self.hits + 1) / (self.hits + self.misses + 2)


# Kinds of step: plain decoding, verify steps (chained behind the step in flight where the proposer and the
# loop allow it), and verify steps that wait for the step before and make the next wait for them (only
# where they could chain: no rejection voids anything, the host's work is not hidden).
PLAIN, VERIFY, WAITED = 0, 1, 2
NAMES = {PLAIN: "plain", VERIFY: "speculative", WAITED: "speculative_waited"}


@dataclass
class _Width:
    """Each kind of step at one batch width: its output rate (tokens/s as at its full rows), and the
    current run."""

    kinds: tuple[int, ...]
    rate: dict[int, float] = field(default_factory=dict)
    # each kind's tokens, seconds and steps since its rate was last updated
    window: dict[int, list[float]] = field(default_factory=dict)
    speculate: int = PLAIN  # the kind being run
    left: int = 0  # steps left in this run
    probing: bool = True
    need: int = 0  # steps a timing run needs timed
    skip: int = 0  # its first steps, not timed (TRANSIENT)
    confirmed: int = 0  # probes in a row that found the faster kind still the faster
    runs: int = 0  # runs ended so far
    timed_at: dict[int, int] = field(default_factory=dict)  # each kind's run count when its rate was set
    # each kind's tokens and seconds a step when its rate was set (a long run's drift: ``_drift``)
    per_step: dict[int, tuple[float, float]] = field(default_factory=dict)
    inherited: int | None = None  # the faster kind taken from a neighbouring width, until measured here

    def __post_init__(self) -> None:
        self.window = {kind: [0.0, 0.0, 0] for kind in self.kinds}


class SpecPolicy:
    """``speculate(rows)`` before a step (its kind: PLAIN, VERIFY or WAITED); ``timed(rows, kind, tokens,
    seconds)`` after it."""

    def __init__(self, k_max: int, adaptive: bool = True, chained: bool = False) -> None:
        self.k_max = k_max
        self.adaptive = adaptive
        self.chained = chained  # verify steps chain: a rejection voids the row's next step
        self._widths: dict[int, _Width] = {}
        self._last = PLAIN  # the kind of the last step decided, at any width

    @property
    def kinds(self) -> tuple[int, ...]:
        return (PLAIN, VERIFY, WAITED) if self.chained else (PLAIN, VERIFY)

    def speculate(self, rows: int) -> int:
        """The kind of the next step with ``rows`` decoding rows (PLAIN: 0, falsy)."""
        if not self.adaptive:
            return VERIFY
        bucket = _bucket(rows)
        width = self._widths.get(bucket)
        if width is None:
            width = self._widths[bucket] = self._new_width(bucket)
        if width.left <= 0:
            self._next_run(width)
        width.left -= 1
        self._last = width.speculate
        return width.speculate

    def _start(self, width: _Width, kind: int, steps: int, probing: bool) -> None:
        """A run of ``steps`` steps of ``kind``; a timing run (``probing``) lasts until that many are timed,
        less the transient ones."""
        width.speculate, width.probing = kind, probing
        width.skip = TRANSIENT if kind != self._last else 0
        width.need = max(1, steps - width.skip)
        width.left = steps + LAG if probing else steps

    def _new_width(self, bucket: int) -> _Width:
        """A width's first run: its measured neighbour's faster kind, timed as it runs; without one, none
        (``_next_run`` times plain steps, then each kind of verify step)."""
        width = _Width(self.kinds)
        for near in (self._widths.get(bucket // 2), self._widths.get(bucket * 2)):
            faster = None if near is None else _faster(near)
            if faster is not None:
                self._start(width, faster, EXPLOIT, probing=False)
                width.inherited = faster
                break
        return width

    def timed(self, rows: int, kind: int, tokens: int, seconds: float) -> None:
        """A decode step's output tokens and wall time (from the previous step's tokens to its own). The
        tokens count as at the width's full rows: a width spans rows up to twice as many, and a kind timed as
        rows finish must not look slower than one timed before (a step's time varies far less than its
        rows)."""
        bucket = _bucket(rows)
        width = self._widths.get(bucket)
        # a step of another kind was decided under a neighbouring width's run (the rows changed between
        # the decision and the step): one such step, with its switch, is no measure of this width
        if width is None or seconds <= 0 or kind != width.speculate:
            return
        if width.skip > 0:
            width.skip -= 1
            return
        if not width.probing and width.left > WINDOW:
            return  # a long run's rate is its last steps': a probe after it is compared with now
        sums = width.window[kind]
        sums[0] += tokens * bucket / max(1, rows)
        sums[1] += seconds
        sums[2] += 1
        if not width.probing:
            return
        best = max((rate for k, rate in width.rate.items() if k != kind), default=0.0)
        slower = best and sums[2] >= EARLY_STEPS and sums[0] / sums[1] < EARLY_SHARE * best
        if slower or sums[2] >= width.need:
            width.left = 0  # timed (clearly a slower kind: after EARLY_STEPS): the run ends here

    def _next_run(self, width: _Width) -> None:
        """Close the run just ended (its rate replaces the kind's) and pick the next: each kind is timed once
        first, then the fastest runs long and the slower ones are timed again between, the one timed longest
        ago first."""
        rate = width.rate
        width.runs += 1
        for kind, (tokens, seconds, steps) in width.window.items():
            if seconds > 0:
                if not width.probing and kind in rate:
                    _drift(rate, width.per_step[kind], (tokens / steps, seconds / steps))
                rate[kind] = tokens / seconds
                width.per_step[kind] = (tokens / steps, seconds / steps)
                width.timed_at[kind] = width.runs
                width.window[kind] = [0.0, 0.0, 0]
        far = VERIFY in rate and PLAIN in rate and rate[VERIFY] < FAR_SHARE * rate[PLAIN]
        if WAITED in width.kinds and WAITED not in rate and far:
            rate[WAITED] = rate[VERIFY]
            width.timed_at[WAITED] = width.timed_at[VERIFY]
        unmeasured = [kind for kind in width.kinds if kind not in rate]  # plain first: it is free
        if unmeasured:
            self._start(width, unmeasured[0], WINDOW, probing=True)
            return
        best = max(width.kinds, key=lambda kind: (width.rate[kind], -kind))  # a tie: the simpler kind
        if width.probing:  # a probe ended: run the fastest, longer each time a probe confirmed it
            width.confirmed = width.confirmed + 1 if best != width.speculate else 0
            exploit = min(MAX_EXPLOIT, EXPLOIT << max(0, width.confirmed - 1))
            self._start(width, best, exploit, probing=False)
        else:  # time a slower kind again: the one timed longest ago
            slower = [kind for kind in width.kinds if kind != best]
            self._start(width, min(slower, key=lambda kind: width.timed_at[kind]), PROBE, probing=True)

    def next_k(self, drafts: RowDrafts, proposed: int, accepted: int, length: int = 0) -> None:
        """A row's guesses after a verify: one more after all were accepted, else one past the accepted;
        with chained verify steps, all K, and a rest when its acceptance falls under one half (``length``:
        the row's tokens now; the rest ends that many tokens later)."""
        if not proposed:
            return
        drafts.k = min(self.k_max, drafts.k + 1) if accepted == proposed else max(1, accepted + 1)
        if self.chained:
            drafts.k = self.k_max
            drafts.hits = DECAY * drafts.hits + accepted
            drafts.misses = DECAY * drafts.misses + (accepted < proposed)
            if drafts.acceptance < 0.5:
                drafts.rest_len = min(MAX_REST, max(REST, 2 * drafts.rest_len))
                drafts.rest_until = length + drafts.rest_len
            elif accepted == proposed:
                drafts.rest_len = 0

    def summary(self) -> dict[str, dict[str, float]]:
        """Each width's latest rates (tokens/s, as at the width's full rows), for the stats file."""
        return {
            str(bucket): {NAMES[kind]: round(rate, 1) for kind, rate in sorted(w.rate.items())}
            for bucket, w in sorted(self._widths.items())
        }


def _drift(rate: dict[int, float], before: tuple[float, float], now: tuple[float, float]) -> None:
    """A long run ended with its kind's tokens and seconds a step moved from ``before`` to ``now``: move the
    other kinds' rates alike. A step's time changes for every kind alike (longer contexts); its tokens,
    the rows' acceptance, only for verify steps (a plain step makes one token a row)."""
    cost = before[1] / now[1]
    gain = now[0] / before[0] if before[0] else 1.0  # (a run of voided rows only: no tokens to compare)
    for kind in rate:
        rate[kind] *= cost * gain if kind != PLAIN else cost


def _faster(width: _Width) -> int | None:
    """The fastest kind at ``width``: measured, or taken from its neighbour; None when neither."""
    if len(width.rate) == len(width.kinds):
        return max(width.kinds, key=lambda kind: (width.rate[kind], -kind))
    return width.inherited


def _bucket(rows: int) -> int:
    """The power of two at or above ``rows``."""
    return 1 << max(0, rows - 1).bit_length()
