"""One timed run per engine: batchgen (sync / async) and the transformers baselines.

Each run returns a flat record (see ``base_record``); the caller adds workload-level fields. Token
counts are taken from the outputs themselves, so a run that silently stopped early shows up as a
mismatch against ``expected_tokens`` instead of as a fast run.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import time
from collections.abc import Iterator
from typing import Any

import torch

from batchgen.bench import metrics
from batchgen.config import SamplingParams
from batchgen.engine.completions import GenerationRequest


def base_record(mode: str, engine: str, requests: int, new_tokens: int) -> dict[str, Any]:
    return {
        "mode": mode,
        "engine": engine,
        "requests": requests,
        "max_new_tokens": new_tokens,
        "expected_tokens": requests * new_tokens,
        "output_tokens": None,
        "wall_s": None,
        "tok_s": None,
        "steps": None,
        "gpu_active_pct": None,
        "cpu_ms_step": None,
        "gpu_ms_step": None,
        "peak_mem_gib": None,
        "roofline": None,
        "errors": 0,
        "note": "",
        "error": None,
    }


@contextlib.contextmanager
def timed(device: torch.device, record: dict) -> Iterator[None]:
    """Wall time with the device drained on both sides, and the peak memory inside."""
    metrics.sync(device)
    metrics.reset_peak_memory(device)
    t0 = time.perf_counter()
    yield
    metrics.sync(device)
    record["wall_s"] = time.perf_counter() - t0
    record["peak_mem_gib"] = metrics.peak_memory_bytes(device) / (1 << 30)
    record["load_1m"] = os.getloadavg()[0]  # CPU timings on a shared machine are only as good as this


def finish(record: dict, output_tokens: int) -> dict:
    record["output_tokens"] = output_tokens
    if record["wall_s"]:
        record["tok_s"] = output_tokens / record["wall_s"]
    return record


# --- batchgen ---------------------------------------------------------------------------------------


def _requests(prompts: list[list[int]], params: SamplingParams) -> list[GenerationRequest]:
    return [GenerationRequest(i, ids, params, key=i) for i, ids in enumerate(prompts)]


def _consume(llm, prompts: list[list[int]], params: SamplingParams) -> tuple[int, int]:
    """Generate without detokenizing (the bench measures the engine, and random ids need no text)."""
    tokens = errors = 0
    for out in llm.stream(_requests(prompts, params), detokenize=False):
        tokens += len(out.token_ids)
        errors += out.finish_reason == "error"
    return tokens, errors


def run_batchgen(
    llm, mode: str, prompts: list[list[int]], new_tokens: int, warmup: list[list[int]] | None,
    json_schema: dict | None = None, sampling: tuple[tuple[str, Any], ...] = (),
) -> dict[str, Any]:  # fmt: skip
    """One timed ``stream`` over ``prompts``. ``warmup`` prompts run first, untimed: kernel compiles,
    CUDA-graph captures (all of them, up front: one GPU otherwise captures on demand, mid-run) and
    allocator growth are one-time costs, not throughput. ``json_schema``: every request is constrained
    by it (structured output); ``sampling``: more SamplingParams fields for every request. B7 runs the whole
    ``batchgen run`` command instead, captures included."""
    record = base_record(mode, "batchgen", len(prompts), new_tokens)
    params = SamplingParams(
        max_new_tokens=new_tokens, ignore_eos=True, json_schema=json_schema, **dict(sampling)
    )
    llm.prepare(params, capture_graphs=True)
    if warmup:
        _consume(llm, warmup, params.with_overrides(max_new_tokens=min(4, new_tokens)))
    before = metrics.snapshot(llm.stats)
    ranks = _rank_busy(llm)
    with timed(llm.device, record):
        tokens, record["errors"] = _consume(llm, prompts, params)
    step = metrics.delta(before, metrics.snapshot(llm.stats))
    if ranks:  # tensor parallelism: every rank's compute stream, not only rank 0's
        busy = [after - start for start, after in zip(ranks, _rank_busy(llm), strict=True)]
        record["gpu_active_pct_ranks"] = [round(100 * b / record["wall_s"], 2) for b in busy]
    if llm.device.type != "cuda":
        step["gpu_busy_s"] = None  # no device stream to be busy: the CPU runner reports 0
    engine_fields(record, step)
    if llm.stats.gpu_idle:  # idle and busy time by step kind (whole life of the LLM: the warm-up too)
        record["gpu_idle"] = llm.stats.gpu_idle
    record.update({f"graph_mib_{k}": round(v / 2**20, 1) for k, v in llm.graph_memory.items()})
    record["max_num_seqs"] = llm.config.max_num_seqs  # the width the engine chose: the roofline's waves
    record["max_batch_tokens"] = llm.config.max_batch_tokens
    return finish(record, tokens)


def _rank_busy(llm) -> list[float]:
    return [r["gpu_busy_s"] for r in llm.rank_stats()]


def engine_fields(record: dict, step: dict, wall_s: float | None = None) -> None:
    """Per-step host and GPU figures from engine stats (``step``: EngineStats fields over the timed run;
    ``gpu_busy_s`` None without a GPU) over ``wall_s`` [the record's]. CPU ms/step is scheduling, batch
    building, postprocessing and masks; launching (``prep_s``, CUDA) is reported apart when known."""
    steps = step["steps"]
    record["steps"] = steps
    if not steps:
        return
    host = [step[n] for n in ("schedule_s", "postprocess_s", "mask_s") if step.get(n) is not None]
    if host:
        record["cpu_ms_step"] = 1000 * sum(host) / steps
    if step.get("mask_s"):  # structured output: advancing grammars and filling token masks
        record["mask_ms_step"] = 1000 * step["mask_s"] / steps
    if step.get("prep_s"):
        record["prep_ms_step"] = 1000 * step["prep_s"] / steps
    if step.get("replay_s"):  # of prep: the graph launches themselves
        record["replay_ms_step"] = 1000 * step["replay_s"] / steps
    if step["gpu_busy_s"] is not None:
        record["gpu_ms_step"] = 1000 * step["gpu_busy_s"] / steps
        record["gpu_active_pct"] = 100 * step["gpu_busy_s"] / (wall_s or record["wall_s"])


# --- transformers baselines -------------------------------------------------------------------------


@contextlib.contextmanager
def attn_implementation(model: torch.nn.Module, name: str) -> Iterator[None]:
    """Run the model with a stock attention for the baselines, then give batchgen its own back."""
    old = model.config._attn_implementation
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        try:
            model.set_attn_implementation(old)
        except (ValueError, KeyError):  # a registered custom name that this transformers refuses to set
            model.config._attn_implementation = old


def _greedy_config(new_tokens: int, eos: int | None, pad: int | None, cb: bool):
    from transformers import GenerationConfig

    if cb:  # generate_batch: EOS -1 disables the EOS check (transformers' own convention)
        return GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1, pad_token_id=pad)
    # generate: min_new_tokens masks EOS until the end, so every row decodes exactly new_tokens
    return GenerationConfig(
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=pad,
    )


def run_generate_batch(
    model, tokenizer, prompts: list[list[int]], new_tokens: int, keep_outputs: bool = False
) -> dict[str, Any]:
    """transformers' continuous batching. Only arguments that 5.17 and later share are passed.
    ``keep_outputs`` adds each prompt's generated ids, in input order, as ``record["outputs"]``."""
    record = base_record("generate_batch", "transformers", len(prompts), new_tokens)
    config = _greedy_config(new_tokens, None, _pad_id(tokenizer), cb=True)
    kwargs: dict[str, Any] = {"generation_config": config}
    accepted = inspect.signature(model.generate_batch).parameters
    if "progress_bar" in accepted:
        kwargs["progress_bar"] = False
    if model.device.type == "cpu" and "continuous_batching_config" in accepted:
        kwargs["continuous_batching_config"] = _cpu_cb_config(prompts, new_tokens)
    # no_grad, not inference_mode: generate_batch's worker thread updates tensors made here in place,
    # and inference tensors refuse that outside inference mode (seen with transformers 5.17).
    with attn_implementation(model, "sdpa"), torch.no_grad(), timed(model.device, record):
        results = model.generate_batch(inputs=prompts, **kwargs)
    outs = list(results.values())
    record["errors"] = sum(getattr(o, "error", None) is not None for o in outs) + len(prompts) - len(outs)
    if keep_outputs:
        record["outputs"] = [list(o.generated_tokens) for o in outs]
    return finish(record, sum(len(o.generated_tokens) for o in outs))


def _cpu_cb_config(prompts: list[list[int]], new_tokens: int):
    """On CPU, generate_batch sizes its cache and static buffers as if RAM were GPU memory: gigabytes
    filled at start-up (longer than a tiny model's whole run). Size them for the workload instead. GPU runs
    keep the defaults, as a user would."""
    from transformers.generation import ContinuousBatchingConfig

    page = ContinuousBatchingConfig().page_size
    per_request = -(-(max(map(len, prompts)) + new_tokens) // page)
    return ContinuousBatchingConfig(num_blocks=len(prompts) * per_request + 1, max_batch_tokens=1024)


def _pad_id(tokenizer) -> int:
    pad = tokenizer.pad_token_id
    return pad if pad is not None else (tokenizer.eos_token_id or 0)


def run_generate_loop(
    model, tokenizer, prompts: list[list[int]], new_tokens: int, limit: int = 4
) -> dict[str, Any]:
    """The hand-written baseline: ``model.generate`` one prompt at a time, on the first ``limit``
    prompts only: a batch-1 rate does not depend on how many prompts follow, and the loop is slow."""
    prompts = prompts[:limit]
    record = base_record("hf_loop", "transformers", len(prompts), new_tokens)
    record["note"] = f"first {len(prompts)} prompts"
    config = _greedy_config(new_tokens, tokenizer.eos_token_id, _pad_id(tokenizer), cb=False)
    tokens = 0
    with attn_implementation(model, "sdpa"), torch.inference_mode(), timed(model.device, record):
        for ids in prompts:
            x = torch.tensor([ids], device=model.device)
            out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), generation_config=config)
            tokens += out.shape[1] - x.shape[1]
    record["steps"] = len(prompts) * new_tokens
    return finish(record, tokens)


def run_generate_padded(model, tokenizer, prompts: list[list[int]], new_tokens: int) -> dict[str, Any]:
    """The other hand-written baseline: one left-padded batch through ``model.generate``."""
    record = base_record("hf_padded", "transformers", len(prompts), new_tokens)
    pad = _pad_id(tokenizer)
    config = _greedy_config(new_tokens, tokenizer.eos_token_id, pad, cb=False)
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=model.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)
    with attn_implementation(model, "sdpa"), torch.inference_mode(), timed(model.device, record):
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    record["steps"] = new_tokens
    return finish(record, (out.shape[1] - width) * len(prompts))
