"""scripts/bench_step.py's synthetic steps on the CPU: its prompt steps, decode steps and their join are
valid engine inputs (the GPU script runs only where a device is, so a changed ``StepInputs`` would
otherwise break it unseen). Oracle: transformers' greedy next token for each synthetic prompt."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from batchgen import LLM
from batchgen.bench.workloads import load_tokenizer

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_step.py"


def _bench_step():
    spec = importlib.util.spec_from_file_location("bench_step", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_synthetic_steps_run_through_the_engine_runner(tiny_llama):
    bench_step = _bench_step()
    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    reference = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    llm = LLM.from_model(model, load_tokenizer(), device="cpu", max_num_seqs=8, kv_cache_bytes=8 << 20,
                         load_format="random", extra={"progress": False})  # fmt: skip
    runner, block = llm._engine.runner, llm.config.block_size
    prompts = bench_step.prefill_inputs(0, 3, 20, block)
    got = runner.fetch(runner.launch(prompts)).tokens
    with torch.no_grad():  # the ids are below the tokenizer's vocabulary, which the tiny model has
        want = reference(torch.as_tensor(prompts.input_ids).view(3, 20)).logits[:, -1].argmax(-1).tolist()
    assert got == want
    decodes = bench_step.decode_inputs(1, 4, 33, block)
    assert len(runner.fetch(runner.launch(decodes)).tokens) == 4
    both = bench_step.join_steps(decodes._replace(step_id=2), prompts._replace(step_id=2), block)
    assert runner.fetch(runner.launch(both)).tokens[4:] == want  # the prompts again, after 4 decodes
