"""The scheduler's array path for decodes against its one-by-one reference (``Scheduler.one_by_one``):
the same engine loop, driven by a model stand-in whose tokens depend on every input the step carries
(token, position, KV slot, sampling row), must build identical steps and yield identical completions,
through preemptions, chunked prefills, EOS, stop strings, length limits, sibling samples, shared
prefixes, logprobs and the row limit, in the synchronous and the asynchronous loop."""

from __future__ import annotations

import numpy as np
import pytest

from batchgen.config import SamplingParams
from batchgen.engine.block_manager import BlockManager
from batchgen.engine.request import Request, Status
from batchgen.engine.rows import COUNTERS, RowState
from batchgen.engine.scheduler import Scheduler
from tests.engine.scheduler_cases import CASES, EOS, run_case


@pytest.mark.parametrize("async_mode", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_array_path_builds_what_one_by_one_builds(async_mode, case):
    num_blocks = case[0]
    want_outs, want_steps, want_stats = run_case(True, async_mode, case)
    outs, steps, stats = run_case(False, async_mode, case)
    assert len(steps) == len(want_steps)
    for i, (got, want) in enumerate(zip(steps, want_steps, strict=True)):
        for name, value in want.items():
            np.testing.assert_array_equal(got[name], value, err_msg=f"step {i}: {name}")
    assert outs == want_outs
    assert stats.preemptions == want_stats.preemptions
    assert stats.discarded_tokens == want_stats.discarded_tokens
    assert stats.prefix_hit_rate == want_stats.prefix_hit_rate
    reasons = [(o[5], bool(o[3]) and o[3][-1] == EOS) for o in outs]
    assert {("stop", True), ("stop", False), ("length", False)} <= set(reasons)  # EOS, stop string, limit
    if num_blocks < 100:
        assert stats.preemptions > 0
    if async_mode:
        assert stats.discarded_tokens > 0  # rows ended with a token in flight


def test_counters_move_with_the_row():
    req = Request(7, 0, 0, None, SamplingParams(), [5, 6, 7], 3, 4, 0)
    req.num_computed, req.num_pending, req.last_step = 2, 1, 9
    rows = RowState(1)
    rows.claim(req)
    assert (rows.num_computed[0], rows.num_pending[0], rows.last_step[0], rows.owner[0]) == (2, 1, 9, 7)
    rows.num_computed[0] += 1  # the scheduler advances the array...
    assert req.num_computed == 3  # ...and the request reads it there
    req.add_token(8)
    assert rows.known[0] == 4
    rows.free(req)
    assert rows.owner[0] == -1 and req.row == -1
    assert [getattr(req, name) for name in COUNTERS] == [3, 1, 0, 9, -1, -1, 0, -1]
    req.num_pending = 0  # back on the request itself
    assert rows.num_pending[0] == 1


def _cache_after_one_decode_step(one_by_one: bool) -> tuple[set, list[int], list[int]]:
    """Block size 4, three blocks. The only free block is cached under the content i fills this step,
    and j, scheduled after i, needs a new block: done row by row (the reference), i finds that content
    cached and registers nothing, then j's new block evicts it."""
    blocks = BlockManager(3, block_size=4)
    scheduler = Scheduler(blocks, 8, 64)
    scheduler.one_by_one = one_by_one
    gone = Request(0, 0, 0, None, SamplingParams(), [1, 2, 3, 4], 4, 8, 0)
    blocks.grow(gone, 4)
    blocks.register_full_blocks(gone, 4)
    blocks.release(gone)  # cached and free: handed out last
    i = Request(1, 1, 0, None, SamplingParams(), [1, 2, 3, 4], 3, 8, 0)  # decodes position 3
    j = Request(2, 2, 0, None, SamplingParams(), [9, 9, 9, 9, 9], 4, 8, 0)  # decodes position 4
    for req, computed in ((i, 3), (j, 4)):  # running, as admission leaves them
        blocks.grow(req, computed)
        scheduler.rows.claim(req)
        req.num_computed, req.status = computed, Status.RUNNING
        scheduler.running.append(req)
    scheduler.schedule()
    return set(blocks._cached), i.block_table, j.block_table


def test_new_blocks_and_prefix_registrations_go_row_by_row():
    assert _cache_after_one_decode_step(False) == _cache_after_one_decode_step(True)
