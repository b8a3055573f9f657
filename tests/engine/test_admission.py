"""When waiting rows join a step that decodes (engine/admission.py): the price of an eager step, the rent
new rows pay by waiting, and the engine's outputs unchanged by when they join (only fewer eager steps)."""

from __future__ import annotations

import numpy as np
import pytest

from batchgen import LLM, GenerationRequest, SamplingParams
from batchgen.engine.admission import DECODE_WINDOW, MAX_PRICE_STEPS, Rent, StepCosts
from batchgen.engine.block_manager import BlockManager
from batchgen.engine.request import Request
from batchgen.engine.scheduler import Scheduler
from tests.engine.scheduler_cases import CASES, run_case


def test_an_eager_step_bound_by_its_launch_costs_its_launch_in_decode_steps():
    costs = StepCosts()
    costs.graph(2.0)
    costs.eager(800.0, 790.0)  # a process's first eager step (Triton's start): ignored
    assert costs.decode_steps_per_join == 0.0
    costs.eager(16.0, 15.0)  # host-bound: the GPU waited for the launch
    assert costs.decode_steps_per_join == pytest.approx((16.0 - 2.0) / 2.0)
    costs.eager(90.0, 89.0)  # a slow launch (a new kernel variant, host jitter)...
    costs.eager(16.0, 15.0)
    assert costs.decode_steps_per_join == pytest.approx(7.0)  # ...moves the median of three no further
    for _ in range(DECODE_WINDOW):
        costs.graph(4.0)  # the decode step's period follows the graph steps...
    costs.graph(60.0)  # ...and a long pause before one (a wave, a capture) is an outlier
    assert costs.decode_steps_per_join == pytest.approx((16.0 - 4.0) / 4.0)


def test_an_eager_step_bound_by_the_gpu_costs_nothing_and_a_bad_measure_is_bounded():
    costs = StepCosts()
    costs.graph(8.0)
    costs.eager(900.0, 900.0)  # the first: ignored
    costs.eager(15.0, 60.0)  # a large model: the launch hid behind 60 ms of work
    assert costs.decode_steps_per_join == 0.0
    costs = StepCosts()
    costs.graph(0.01)
    costs.eager(900.0, 900.0)
    costs.eager(500.0, 500.0)
    assert costs.decode_steps_per_join == MAX_PRICE_STEPS


def test_a_graphed_step_with_new_prompts_costs_its_period_past_a_decode_step():
    """Once steps with new prompts replay their token bucket's graph (mixed_graphs.py), their price is
    what they last on the GPU beyond a decode step: the eager launches age out of the median."""
    costs = StepCosts()
    costs.graph(2.0)
    costs.eager(800.0, 790.0)  # the first: ignored
    costs.eager(16.0, 15.0)
    assert costs.decode_steps_per_join == pytest.approx(7.0)
    for _ in range(8):
        costs.mixed(3.0)
    assert costs.decode_steps_per_join == pytest.approx(0.5)
    costs.mixed(1.5)  # a graphed step no longer than a decode step is free
    for _ in range(8):
        costs.mixed(1.0)
    assert costs.decode_steps_per_join == 0.0


def test_rent_holds_rows_until_the_rows_left_empty_add_up_to_the_price():
    rent = Rent()
    assert not rent.holds(free_rows=3, waiting=10, joins_anyway=False)  # no price: at once
    rent.price = 10.0
    assert [rent.holds(3, 10, False) for _ in range(5)] == [True, True, True, True, False]
    assert rent.paid == 12.0  # paid until rows join (``settle``)
    rent.settle()
    assert rent.holds(3, 1, False) and rent.paid == 1.0  # one row waits: one row-step of rent
    assert not rent.holds(3, 10, joins_anyway=True)  # a chunk makes it a step with prompts anyway
    assert not rent.holds(3, 0, False)  # nothing waits


@pytest.mark.parametrize("started", [0, 1])
def test_the_rent_starts_over_only_once_rows_joined(started):
    """A step whose admission starts nothing (the KV cache is full, say) keeps what was paid."""
    scheduler = Scheduler(BlockManager(64, block_size=4), max_num_seqs=4, max_batch_tokens=4096)
    scheduler.rent.price = scheduler.rent.paid = 5.0
    scheduler.add(Request(7, 0, 0, None, SamplingParams(), [5, 6, 7], 3, 4, 0))
    scheduler._admit = lambda step, budget: started
    scheduler.schedule()
    assert scheduler.rent.paid == (5.0 if started == 0 else 0.0)


ROOMY = (400, 16, 4096, False)  # a token budget that can take every waiting row in one step


def _prompt_steps(steps: list[dict]) -> int:
    """Steps with a prompt's tokens (more than one for some sequence): the eager ones on a GPU."""
    return sum(int(s["max_q_len"]) > 1 for s in steps)


@pytest.mark.parametrize("async_mode", [False, True])
@pytest.mark.parametrize("case", [*CASES, ROOMY])
def test_rows_that_wait_get_the_same_tokens_in_fewer_eager_steps(async_mode, case):
    """The scheduler test's model stand-in (tokens from every input a step carries) through preemption,
    chunked prefills, stop strings and the row limit: holding new rows back changes when they run, not
    what they produce, and the array path still builds step for step what the one-by-one reference
    builds. Under a roomy token budget the rows join in far fewer prompt steps; under the scheduler
    cases' small budgets they are held less often (the rows a step could take often need more than its
    budget) and never join in more."""
    price = 4.0 * case[1]  # four decode steps' worth of rows
    want, want_steps, _ = run_case(False, async_mode, case)
    outs, steps, _ = run_case(False, async_mode, case, price=price)
    ref_outs, ref_steps, _ = run_case(True, async_mode, case, price=price)
    assert sorted(outs) == sorted(want)
    assert outs == ref_outs and len(steps) == len(ref_steps)
    for i, (got, ref) in enumerate(zip(steps, ref_steps, strict=True)):
        for name, value in ref.items():
            np.testing.assert_array_equal(got[name], value, err_msg=f"step {i}: {name}")
    if case == ROOMY:
        assert _prompt_steps(steps) < 0.3 * _prompt_steps(want_steps)
    else:
        assert _prompt_steps(steps) <= _prompt_steps(want_steps)


def test_the_engine_prices_admission_from_its_runner(tiny_llama):
    """A runner that measures its steps (the CUDA runner's ``step_costs``) sets the price: rows join in
    fewer prompt steps, with the tokens of an engine admitting them at once."""
    rows = [
        GenerationRequest(i, [5 + i % 7, 9, 11 + i % 5, 3], SamplingParams(max_new_tokens=2 + (7 * i) % 13))
        for i in range(24)
    ]

    def run(price_steps: float | None) -> tuple[dict, int]:
        llm = LLM(tiny_llama, max_num_seqs=6)
        if price_steps is not None:
            llm._engine._costs = type("Measured", (), {"decode_steps_per_join": price_steps})()
        scheduler = llm._engine.scheduler
        schedule, prompt_steps = scheduler.schedule, []

        def counted(drafts=None):
            step = schedule(drafts)
            prompt_steps.append(any(item.num_tokens > 1 for item in step.items))
            return step

        scheduler.schedule = counted
        outs = {(o.index, o.sample): o.token_ids for o in llm.stream(rows)}
        if price_steps is not None:
            assert scheduler.rent.price == 6 * price_steps
        return outs, sum(prompt_steps)

    want, at_once = run(None)
    got, held = run(3.0)
    assert got == want
    assert held < at_once
