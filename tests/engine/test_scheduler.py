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
from batchgen.engine.engine import Engine
from batchgen.engine.outputs import GenerationRequest
from batchgen.engine.request import Request, Status
from batchgen.engine.rows import COUNTERS, RowState
from batchgen.engine.runner_protocol import Runner, StepResult
from batchgen.engine.scheduler import Scheduler
from batchgen.engine.stops import StopChecker

VOCAB, EOS = 50, 2


class Letters:
    """A tokenizer stand-in for stop strings: token t decodes to one letter."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(97 + t % 26) for t in ids)


class Recorder(Runner):
    """Samples a token from the step's inputs (carry-over applied as the device does), records every
    step's arrays, and checks that the persistent batch agrees with its running requests."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.steps: list[dict[str, np.ndarray]] = []
        self._prev: np.ndarray | None = None

    def launch(self, inputs):
        rows = self.scheduler.rows
        for req in self.scheduler.running:
            row, table = req.row, req.block_table
            assert (rows.owner[row], rows.known[row]) == (req.request_id, len(req.tokens))
            assert rows.synced[row] == len(table) and rows.tables[row, : len(table)].tolist() == table
        ids = inputs.input_ids.copy()
        carried = inputs.carry_rows >= 0
        if carried.any():
            ids[carried] = self._prev[inputs.carry_rows[carried]]
        self.steps.append({k: np.asarray(v).copy() for k, v in inputs._asdict().items()})
        rows = inputs.logits_indices
        mix = ids[rows] * 31 + inputs.positions[rows] * 7
        mix = mix + inputs.rng_keys % 97 + inputs.rng_steps * 13 + (inputs.temperature * 10).astype(np.int64)
        tokens = mix % VOCAB
        self._prev = tokens
        logprobs = (-tokens / VOCAB).tolist() if inputs.features.logprobs else None
        return inputs.step_id, tokens.tolist(), logprobs

    def fetch(self, handle) -> StepResult:
        return StepResult(*handle)

    def reset(self) -> None:
        self._prev = None


def _rows(count: int, seed: int, twins: bool) -> list[GenerationRequest]:
    """Random rows; with ``twins`` rows come in greedy pairs of one prompt, whose outputs fill blocks
    of the same content (one registered, one found in the prefix cache)."""
    rng = np.random.default_rng(seed)
    shared = rng.integers(3, VOCAB, 20).tolist()  # a system prompt: prefix-cache hits
    rows, own = [], []
    for i in range(count):
        if not (twins and i % 2):
            own = rng.integers(3, VOCAB, int(rng.integers(1, 40))).tolist()
        params = SamplingParams(
            max_new_tokens=int(rng.integers(1, 30)),
            temperature=0.0 if twins else float(rng.choice([0.0, 0.8])),
            ignore_eos=bool(rng.random() < 0.5),
            stop=("qk", "z") if rng.random() < 0.3 else (),
            n=int(rng.choice([1, 1, 2])),
            logprobs=bool(rng.random() < 0.3),
            seed=i // 2 if twins else i,
        )
        rows.append(GenerationRequest(i, (shared if i % 3 else []) + own, params))
    return rows


def _run(one_by_one: bool, async_mode: bool, case: tuple[int, int, int, bool], price: float = 0.0):
    """``price``: row-steps new rows wait for before they join a step that decodes (engine/admission.py)."""
    num_blocks, max_num_seqs, max_batch_tokens, twins = case
    blocks = BlockManager(num_blocks, block_size=4)
    scheduler = Scheduler(blocks, max_num_seqs, max_batch_tokens)
    scheduler.one_by_one = one_by_one
    scheduler.rent.price = price
    runner = Recorder(scheduler)
    engine = Engine(runner, blocks, scheduler, StopChecker(Letters(), {EOS}), 128, async_mode=async_mode)
    outs = [tuple(o) for o in engine.stream(_rows(60, max_num_seqs, twins), detokenize=True)]
    assert blocks.num_free == num_blocks, "every block is released"
    return outs, runner.steps, engine.stats


# (num_blocks, max_num_seqs, max_batch_tokens, twins): roomy; preempting; row limit and tiny budget;
# greedy twins in a small cache: decodes fill blocks whose content the twin registered.
CASES = [(400, 16, 64, False), (40, 12, 48, False), (400, 5, 9, False), (48, 10, 40, True)]


@pytest.mark.parametrize("async_mode", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_array_path_builds_what_one_by_one_builds(async_mode, case):
    num_blocks = case[0]
    want_outs, want_steps, want_stats = _run(True, async_mode, case)
    outs, steps, stats = _run(False, async_mode, case)
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
    assert [getattr(req, name) for name in COUNTERS] == [3, 1, 0, 9, -1, -1]
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
