"""The speculation policy (engine/speculative/policy.py): which kind of step runs at each batch width, from
the rates it times, and when the slower kinds are timed again."""

from __future__ import annotations

import itertools

import pytest

from batchgen.engine.speculative import policy as policy_module
from batchgen.engine.speculative.policy import SpecPolicy


def _drive(policy: SpecPolicy, steps: int, speculative_rate: float, plain_rate: float, rows: int = 8) -> list:
    """Run ``steps`` steps where a verify step makes ``speculative_rate`` tokens/s and a plain one
    ``plain_rate``; the kinds the policy chose."""
    kinds = []
    for _ in range(steps):
        speculate = policy.speculate(rows)
        kinds.append(speculate)
        policy.timed(rows, speculate, 10, 10 / (speculative_rate if speculate else plain_rate))
    return kinds


def test_three_kinds_the_fastest_runs_and_the_slower_two_are_probed_in_turn():
    """Where verify steps can chain, verify steps that wait are a third kind, timed like the others."""
    window, probe, exploit = policy_module.WINDOW, policy_module.PROBE, policy_module.EXPLOIT
    rates = {policy_module.PLAIN: 100.0, policy_module.VERIFY: 95.0, policy_module.WAITED: 110.0}
    policy, kinds = SpecPolicy(4, chained=True), []
    for _ in range(3 * window + 8 * exploit):
        kind = policy.speculate(8)
        kinds.append(kind)
        policy.timed(8, kind, 10, 10 / rates[kind])
    assert kinds[: 3 * window] == [0] * window + [1] * window + [2] * window  # each timed once, in order
    rest = kinds[3 * window :]
    probes = [rest[i] for i in range(1, len(rest)) if rest[i] != 2 and rest[i - 1] == 2]
    assert probes[:3] == [0, 1, 0] and sum(k != 2 for k in rest) == probe * len(probes)
    assert set(policy.summary()["8"]) == {"plain", "speculative", "speculative_waited"}


def test_the_slower_kind_timed_longest_ago_is_probed_next():
    """The fastest kind changes between probes (plain's probe finds it faster than waited verify steps
    now): the next probe times chained verify steps, whose rate is the oldest, not waited ones again (turns
    counted over the changing list of slower kinds would skip a kind for good)."""
    plain, verify, waited = policy_module.PLAIN, policy_module.VERIFY, policy_module.WAITED
    rates = {plain: 100.0, verify: 60.0, waited: 110.0}
    policy, kinds = SpecPolicy(4, chained=True), []
    for _ in range(3 * policy_module.WINDOW + 4 * policy_module.EXPLOIT):
        kinds.append(policy.speculate(8))
        if kinds[-2:] == [waited, plain]:
            rates[plain] = 120.0
        policy.timed(8, kinds[-1], 10, 10 / rates[kinds[-1]])
    runs = [kind for i, kind in enumerate(kinds) if i == 0 or kinds[i - 1] != kind]
    assert runs[:5] == [plain, verify, waited, plain, verify]


def test_a_long_runs_drift_moves_plain_only_by_its_step_time():
    """A long run's rate moves the others' (policy._drift): a step's time for every kind, its tokens a step
    (its rows' acceptance) for the verify kinds only."""
    plain, verify, waited = policy_module.PLAIN, policy_module.VERIFY, policy_module.WAITED
    rates = {plain: 100.0, verify: 150.0, waited: 120.0}
    policy_module._drift(rates, (30.0, 0.01), (15.0, 0.01))  # verify steps: half the tokens, same time
    assert rates == {plain: 100.0, verify: 75.0, waited: 60.0}
    policy_module._drift(rates, (8.0, 0.01), (8.0, 0.02))  # plain steps twice as long
    assert rates == {plain: 50.0, verify: 37.5, waited: 30.0}


def test_waited_verify_steps_are_not_timed_when_chained_ones_are_far_slower_than_plain():
    window, early, transient = policy_module.WINDOW, policy_module.EARLY_STEPS, policy_module.TRANSIENT
    rates = {policy_module.PLAIN: 100.0, policy_module.VERIFY: 20.0, policy_module.WAITED: 25.0}
    policy, kinds = SpecPolicy(4, chained=True), []
    for _ in range(window + transient + early + 50):
        kind = policy.speculate(8)
        kinds.append(kind)
        policy.timed(8, kind, 10, 10 / rates[kind])
    assert kinds == [0] * window + [1] * (transient + early) + [0] * 50


def test_policy_runs_the_faster_kind_and_probes_the_slower_ever_less_often():
    window, probe, exploit = policy_module.WINDOW, policy_module.PROBE, policy_module.EXPLOIT
    steps = 2 * window + 16 * exploit
    slow = _drive(SpecPolicy(4), steps, speculative_rate=85.0, plain_rate=100.0)  # not clearly slower
    assert slow[:window] == [False] * window and slow[window : 2 * window] == [True] * window  # plain first
    rest = slow[2 * window :]
    probes = [i for i in range(len(rest)) if rest[i] and (i == 0 or not rest[i - 1])]
    assert sum(rest) == probe * len(probes) and len(probes) >= 3
    gaps = [b - a for a, b in zip(probes, probes[1:], strict=False)]
    assert gaps == sorted(gaps) and gaps[-1] > gaps[0]  # each confirming probe waits longer
    assert sum(rest) / len(rest) < 0.02  # speculation that cannot help costs a sliver of the steps
    fast = _drive(SpecPolicy(4), steps, speculative_rate=150.0, plain_rate=100.0)
    assert sum(fast[2 * window :]) / len(fast[2 * window :]) > 0.97


@pytest.mark.parametrize("speculative_rate", [20.0, 70.0])
def test_a_kind_clearly_slower_is_timed_for_two_steps_only(speculative_rate):
    """Verify steps at a fifth, or 70 %, of plain's rate: the first window of them, and each probe, ends
    after two timed steps (behind the switch's untimed ones): a probe of a long verify step costs little."""
    window, early, transient = policy_module.WINDOW, policy_module.EARLY_STEPS, policy_module.TRANSIENT
    run = transient + early
    kinds = _drive(SpecPolicy(4), window + run + 2000, speculative_rate=speculative_rate, plain_rate=100.0)
    assert kinds[: window + run] == [False] * window + [True] * run and not kinds[window + run]
    runs = [i for i in range(1, len(kinds)) if kinds[i] and not kinds[i - 1]]
    assert all(kinds[i : i + run + 1] == [True] * run + [False] for i in runs)
    assert sum(kinds) == run * len(runs)


@pytest.mark.parametrize("faster", [True, False])
def test_a_width_next_to_a_measured_one_starts_with_its_faster_kind(faster):
    """Rows finishing one by one pass through widths 8, 4, 2: each starts with its measured neighbour's
    faster kind and times the other only after a run of it (a width far away still times both)."""
    exploit, window = policy_module.EXPLOIT, policy_module.WINDOW
    spec, plain = (115.0, 100.0) if faster else (85.0, 100.0)
    policy = SpecPolicy(4)
    _drive(policy, 100, speculative_rate=spec, plain_rate=plain, rows=8)
    kinds = _drive(policy, exploit + window + 1, speculative_rate=spec, plain_rate=plain, rows=4)
    assert kinds[:exploit] == [faster] * exploit and kinds[exploit:-1] == [not faster] * window
    assert kinds[-1] == faster and set(policy.summary()["4"]) == {"plain", "speculative"}
    assert not policy.speculate(64)  # not a neighbour of 4 or 8: plain steps timed first


def test_policy_measures_each_width_apart():
    policy = SpecPolicy(4)
    _drive(policy, 100, speculative_rate=200.0, plain_rate=100.0, rows=4)
    assert not policy.speculate(256)  # a new width starts by timing plain steps
    rates = policy.summary()
    assert rates["4"]["speculative"] == pytest.approx(200.0) and rates["4"]["plain"] == pytest.approx(100.0)


def _drive_async(policy: SpecPolicy, steps: int, rates, lag: int = 2, rows: int = 8) -> list:
    """As the asynchronous loop drives it: each step timed ``lag`` steps after it is decided. ``rates(kind,
    nth)``: (tokens, seconds) of the ``nth`` step of a run of ``kind``."""
    kinds, queue, nth = [], [], 0
    for _ in range(steps):
        kind = policy.speculate(rows)
        nth = nth + 1 if kinds and kinds[-1] == kind else 0
        kinds.append(kind)
        queue.append((kind, *rates(kind, nth)))
        if len(queue) > lag:
            policy.timed(rows, *queue.pop(0))
    return kinds


def test_verify_steps_are_timed_past_their_start_however_late_their_timings_come():
    """Chained verify steps behind a plain one start with no guesses known (a plain step's tokens, and
    the wait for the step before), and each step's timing comes back after the next ones are decided: a
    probe of them must time the steps that follow the switch."""

    def rates(kind, nth):
        if not kind:
            return 10, 0.1
        return (10, 0.2) if nth < 2 else (13, 0.11)  # one step in flight at the switch, one being built

    kinds = _drive_async(SpecPolicy(4), 3000, rates)
    assert sum(kinds[1000:]) / 2000 > 0.97


def test_a_probe_replaces_the_rate_of_an_earlier_phase():
    """Rows' acceptance moves as they go (an answer's opening copies nothing of its prompt, its body does):
    verify steps timed slower at first win once a probe finds them faster now."""
    window, exploit, probe = policy_module.WINDOW, policy_module.EXPLOIT, policy_module.PROBE
    policy = SpecPolicy(4)
    assert not any(_drive(policy, 2 * window + 10, speculative_rate=60.0, plain_rate=100.0)[2 * window :])
    later = _drive(policy, exploit + probe + 100, speculative_rate=200.0, plain_rate=100.0)
    assert sum(later[-100:]) >= 90  # verify steps, but for the probes of plain ones


@pytest.mark.parametrize("fastest", [policy_module.PLAIN, policy_module.VERIFY, policy_module.WAITED])
def test_rates_timed_at_different_times_compare_as_steps_slow_down(fastest):
    """Every step slows as the rows' contexts grow (up to 8x over the run), each kind alike: the fastest
    kind still runs nearly all steps, though a kind timed early made more tokens a second than the
    fastest one does later (the run's rate is its last steps'; the others drift with it)."""
    clock = itertools.count()
    share = dict.fromkeys((policy_module.PLAIN, policy_module.VERIFY, policy_module.WAITED), 0.85)
    share[fastest] = 1.0

    def rates(kind, nth):
        return 10, 0.01 * (1 + next(clock) / 150) / share[kind]

    kinds = _drive_async(SpecPolicy(4, chained=True), 1024, rates)
    assert sum(kind == fastest for kind in kinds[40:]) / len(kinds[40:]) > 0.96


def test_a_kind_timed_as_rows_finish_is_not_taken_for_slower():
    """Width 32 holds 17 to 32 rows: plain steps timed at 32 rows, verify steps at 17 making 1.5x the
    tokens a row in the same time, are the faster kind (tokens count as at the width's full rows)."""
    policy, kinds = SpecPolicy(4), []
    for step in range(400):
        rows = 32 if step < policy_module.WINDOW else 17
        kind = policy.speculate(rows)
        kinds.append(kind)
        policy.timed(rows, kind, int(rows * (1.5 if kind else 1)), 0.1)
    assert sum(kinds[100:]) / 300 > 0.95


def test_always_policy_never_asks_the_clock():
    assert all(_drive(SpecPolicy(4, adaptive=False), 50, speculative_rate=1.0, plain_rate=100.0))
