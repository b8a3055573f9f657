"""The engine loop: async (one step in flight) == sync, late postprocessing, carry-over, drain."""

from __future__ import annotations

import pytest
import torch

from batchgen import LLM, GenerationRequest, SamplingParams
from batchgen.engine.block_manager import BlockManager
from batchgen.engine.engine import Engine
from batchgen.engine.runner import apply_carry_over
from batchgen.engine.runner_protocol import Runner, StepResult
from batchgen.engine.scheduler import Scheduler
from batchgen.engine.stops import StopChecker
from batchgen.model.kv_cache import kv_shape
from batchgen.threads import HostTurns
from tests.engine.oracle import make_prompts

PARAMS = [
    SamplingParams(max_new_tokens=16),
    SamplingParams(max_new_tokens=16, temperature=0.9, top_p=0.9, seed=4, n=2),
    SamplingParams(max_new_tokens=9, temperature=1.2, top_k=20, seed=5),
]


def _requests(prompts, stop_words: dict[int, str]):
    # Stop strings end some requests mid-pipeline: in async mode their next step is already launched.
    reqs = []
    for i, ids in enumerate(prompts):
        params = PARAMS[i % len(PARAMS)]
        if i in stop_words:
            params = params.with_overrides(stop=(stop_words[i],))
        reqs.append(GenerationRequest(i, ids, params))
    return reqs


def _run(path, reqs, **options):
    llm = LLM(path, **options)
    outs = {(o.index, o.sample): (o.token_ids, o.text, o.finish_reason) for o in llm.stream(reqs)}
    blocks = llm._engine.blocks
    assert blocks.num_free == blocks.num_blocks, "every block is released once the run ends"
    return outs, llm.stats


def test_async_equals_sync_with_mid_pipeline_finishes_preemption_and_chunks(tiny_llama):
    from transformers import AutoConfig, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    prompts = make_prompts(tokenizer, count=20, max_tokens=200, seed=3)
    free, _ = _run(tiny_llama, _requests(prompts, {}), max_num_seqs=6)
    # A word each odd row produced on its own: as a stop string it ends that row early.
    words = {}
    for i in range(1, len(prompts), 2):
        text_words = free[(i, 0)][1].split()
        if len(text_words) > 3:
            words[i] = text_words[1 + i % 3]
    assert len(words) >= 3
    kv_bytes = kv_shape(AutoConfig.from_pretrained(tiny_llama)).bytes_per_block(300, torch.float32)
    options = dict(max_num_seqs=6, max_batch_tokens=40, kv_cache_bytes=kv_bytes)
    sync, sync_stats = _run(tiny_llama, _requests(prompts, words), async_mode=False, **options)
    asyn, async_stats = _run(tiny_llama, _requests(prompts, words), async_mode=True, **options)
    assert sync == asyn
    assert sum(reason == "stop" for (_, _, reason) in sync.values()) >= 3
    assert async_stats.preemptions > 0 and sync_stats.preemptions > 0
    # The one-step-late loop ran: steps launched before their predecessor was postprocessed, and the
    # rows a stop string ended had one more token already in flight, which was discarded.
    assert async_stats.overlapped_steps > 0 and async_stats.discarded_tokens > 0, async_stats
    assert sync_stats.overlapped_steps == 0 and sync_stats.discarded_tokens == 0, sync_stats


def test_carry_over_gathers_previous_step_tokens():
    ids = torch.tensor([7, 0, 9, 0])
    carry = torch.tensor([-1, 2, -1, 0])
    prev = torch.tensor([100, 101, 102])
    assert apply_carry_over(ids, carry, prev).tolist() == [7, 102, 9, 100]
    assert apply_carry_over(ids, torch.full((4,), -1), None).tolist() == [7, 0, 9, 0]


@pytest.mark.parametrize("async_mode", [False, True])
def test_drain_finishes_started_rows_and_drops_queued_ones(tiny_llama, async_mode):
    llm = LLM(tiny_llama, max_num_seqs=2, async_mode=async_mode)
    reqs = [GenerationRequest(i, [5, 6, 7 + i], SamplingParams(max_new_tokens=6 + i)) for i in range(12)]
    stream = llm.stream(reqs)
    first = next(stream)
    llm.drain()
    rest = list(stream)
    done = [first, *rest]
    # Only rows already started finish: the 2 running when the first finished, and the rows of the step
    # the engine launched before handing that output over (it queues the next step first).
    assert 1 <= len(done) <= 4, [o.index for o in done]
    assert llm.stats.dropped > 0  # queued rows were dropped, and the caller can tell
    assert all(o.finish_reason == "length" and o.completion_tokens == 6 + o.index for o in done)
    blocks = llm._engine.blocks
    assert blocks.num_free == blocks.num_blocks


@pytest.mark.parametrize("async_mode", [False, True])
def test_stream_closed_early_leaves_the_engine_clean(tiny_llama, async_mode):
    from transformers import AutoConfig

    kv_bytes = kv_shape(AutoConfig.from_pretrained(tiny_llama)).bytes_per_block(18 * 4, torch.float32)
    llm = LLM(tiny_llama, max_num_seqs=4, block_size=4, kv_cache_bytes=kv_bytes, async_mode=async_mode)
    reqs = [GenerationRequest(i, [5, 6, 7, 8, 9 + i], SamplingParams(max_new_tokens=12)) for i in range(10)]
    expected = {o.index: o.token_ids for o in llm.stream(reqs)}
    stream = llm.stream(reqs)
    next(stream)
    assert torch.is_inference_mode_enabled() is False  # the caller's loop body runs in normal mode
    stream.close()
    blocks = llm._engine.blocks
    assert blocks.num_free == blocks.num_blocks
    again = {o.index: o.token_ids for o in llm.stream(reqs)}  # no leftovers, no stale carry-over
    assert again == expected


class WaitingRunner(Runner):
    """Every other step is still on the 'device' when fetched; records whether the helper threads had
    their turn during each fetch."""

    tells_waits = True

    def __init__(self, turns: HostTurns) -> None:
        self.turns, self.fetches = turns, []

    def launch(self, inputs):
        return inputs.step_id, [5] * len(inputs.logits_indices)

    def ready(self, handle) -> bool:
        return handle[0] % 2 == 0

    def fetch(self, handle) -> StepResult:
        self.fetches.append((self.ready(handle), self.turns.helpers_turn))
        return StepResult(handle[0], handle[1], None)

    def reset(self) -> None:
        pass


def test_a_wait_for_the_device_is_the_helper_threads_turn():
    turns = HostTurns()
    runner = WaitingRunner(turns)
    blocks = BlockManager(64, block_size=4)
    engine = Engine(runner, blocks, Scheduler(blocks, 4, 64), StopChecker(None, {2}), 64, async_mode=True)
    rows = [GenerationRequest(i, [3 + i, 4, 5], SamplingParams(max_new_tokens=6)) for i in range(6)]
    with turns.generating():
        outs = list(engine.stream(rows, detokenize=False, turns=turns))
    assert len(outs) == 6 and all(len(o.token_ids) == 6 for o in outs)
    assert {ready for ready, _ in runner.fetches} == {True, False}
    assert all(turn == (not ready) for ready, turn in runner.fetches)  # open only while it waits
