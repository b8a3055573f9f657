"""The batch width chosen when ``--max-num-seqs`` is not given (engine/batch_width.py), and where the
choice reaches: the engine's scheduler and runner, ``LLM.config``, the run's requests-left cap."""

from __future__ import annotations

import pytest
import torch

from batchgen import LLM
from batchgen.app.options import RunOptions
from batchgen.app.sizing import engine_options
from batchgen.config import EngineConfig
from batchgen.engine.batch_width import (
    CPU_WIDTH,
    ROW_TOKENS,
    auto_width,
    pool_width,
    rows_in_budget,
    width_for,
)  # fmt: skip
from batchgen.io.readers import open_input


@pytest.mark.parametrize(
    ("kv_tokens", "cap", "want"),
    [
        (600 * ROW_TOKENS + 5, 1024, 600),  # the pool's rows at ROW_TOKENS each
        (5000 * ROW_TOKENS, 1024, 1024),  # a roomy pool: the cap
        (ROW_TOKENS - 1, 1024, 1),  # less than one row's worth: one row, never zero
        (600 * ROW_TOKENS, 512, 512),  # a lowered cap (fewer requests left) wins
    ],
)
def test_a_gpu_width_is_the_rows_the_kv_cache_holds_up_to_the_cap(kv_tokens, cap, want):
    assert auto_width(kv_tokens, cap, on_gpu=True) == want


def test_the_cpu_width_is_fixed_and_capped():
    assert auto_width(10**9, 1024, on_gpu=False) == CPU_WIDTH
    assert auto_width(10**9, 4, on_gpu=False) == 4


def test_an_explicit_width_stands_whatever_the_pool():
    assert width_for(3000, ROW_TOKENS, 1024, on_gpu=True) == 3000
    assert width_for(None, 10 * ROW_TOKENS, 1024, on_gpu=True) == 10


def test_each_row_of_a_budget_takes_its_kv_and_its_logits_room():
    assert rows_in_budget(10 * (300 + 100) + 399, 300, 100, 1024) == 10
    assert rows_in_budget(10**12, 300, 100, 64) == 64
    assert rows_in_budget(5, 300, 100, 64) == 1


def test_the_pool_is_sized_for_the_widest_batch_the_choice_can_make():
    assert pool_width(None, 1024, on_gpu=True) == 1024
    assert pool_width(None, 1024, on_gpu=False) == CPU_WIDTH
    assert pool_width(7, 1024, on_gpu=True) == 7


def test_llm_config_reports_the_width_the_engine_chose(tiny_llama):
    llm = LLM(tiny_llama, dtype="float32", device="cpu")
    assert llm.config.max_num_seqs == CPU_WIDTH
    assert llm._engine.scheduler.max_num_seqs == CPU_WIDTH
    assert LLM(tiny_llama, dtype="float32", device="cpu", max_num_seqs=5).config.max_num_seqs == 5


def _sized(tmp_path, rows: int, **engine) -> EngineConfig:
    path = tmp_path / "in.jsonl"
    path.write_text("".join(f'{{"prompt": "p{i}"}}\n' for i in range(rows)))
    opts = RunOptions(input=str(path), output=str(tmp_path / "out.jsonl"), engine=EngineConfig(**engine))
    return engine_options(opts, open_input(str(path)), rows_done=0)


def test_few_requests_lower_the_automatic_cap_and_leave_the_choice_to_the_pool(tmp_path):
    sized = _sized(tmp_path, 3)
    assert sized.max_num_seqs is None and sized.max_num_seqs_cap == 3
    assert _sized(tmp_path, 3, max_num_seqs=2).max_num_seqs == 2  # fewer than the requests: stands
    assert _sized(tmp_path, 3, max_num_seqs=8).max_num_seqs == 3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_gpu_engine_batches_the_rows_its_kv_pool_holds(tiny_llama):
    llm = LLM(tiny_llama, dtype="bfloat16", device="cuda", kv_cache_bytes=64 << 20)
    kv_tokens = llm.num_kv_blocks * llm.config.block_size
    assert llm.config.max_num_seqs == min(1024, kv_tokens // ROW_TOKENS) > 0
    assert llm._engine.scheduler.max_num_seqs == llm.config.max_num_seqs
