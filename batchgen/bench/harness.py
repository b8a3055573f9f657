"""The bench harness behind ``batchgen bench`` (``run_bench``): each workload prepared once (model, prompts),
run in each mode beside its baselines, and the tables printed and written."""

from __future__ import annotations

import gc
import os
import platform
import shlex
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from batchgen.bench import metrics, report, runners, whole_commands
from batchgen.bench.workloads import (
    ARCHS,
    EMBEDDED,
    Workload,
    arch_config,
    build_random_model,
    chat_prompts,
    get_workload,
    load_tokenizer,
    mixed_prompts,
    random_prompts,
    staggered_lengths,
    text_prompts,
)
from batchgen.bench.workloads import quick as quick_workload
from batchgen.model.loader import load_model, resolve_device
from batchgen.model.tokenize import encode_prompt

ENGINE_MODES = ("async", "sync")
DEFAULT_MODES = list(ENGINE_MODES)
_SAVE_LIMIT = 2_000_000_000  # params: without LLM.from_model, only models this small go through a temp dir
# One wave of requests: the warm-up and burn-in runs, and the baselines' concurrency in their roofline
# (batchgen's runs use the width their engine chose).
_WAVE = 256
_BURN_IN_TOKENS = 1024


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class CommandOptions:
    """For whole-command workloads: the thread count of both commands (None: each its own default), a
    JSONL prompt file instead of the built-in mix, and how many side-by-side rounds."""

    threads: int | None = None
    prompts: str | None = None
    repeat: int = 1


@dataclass
class Prepared:
    """A workload made concrete: the model (shared by every mode), its prompts, and an LLM factory."""

    workload: Workload
    model: torch.nn.Module
    tokenizer: Any
    make_llm: Callable[..., Any]
    prompts: list[list[int]]
    warmup: list[list[int]]
    device: torch.device
    tmp: tempfile.TemporaryDirectory | None = None

    @property
    def mean_prompt_len(self) -> float:
        return sum(map(len, self.prompts)) / len(self.prompts)

    @property
    def shape(self) -> str:
        return f"{len(self.prompts)} x ({self.mean_prompt_len:.0f} + {self.workload.max_new_tokens})"


def _llm_factory(model, tokenizer, fallback: Callable[..., Any]) -> Callable[..., Any]:
    from batchgen.llm import LLM

    if hasattr(LLM, "from_model"):
        return lambda **opts: LLM.from_model(model, tokenizer, load_format="random", **opts)  # uncalibrated
    return fallback


def _saved_fallback(w: Workload, model, tokenizer, holder: list) -> Callable[..., Any]:
    """Without ``LLM.from_model``: save a small model to a temp dir and load it by path."""
    from batchgen.llm import LLM

    def make(**opts):
        n = sum(p.numel() for p in model.parameters())
        if n > _SAVE_LIMIT:
            raise RuntimeError(f"{w.arch} has {n / 1e9:.1f}B params: the bench needs LLM.from_model for it")
        if not holder:
            holder.append(tempfile.TemporaryDirectory(prefix="batchgen-bench-"))
            model.save_pretrained(holder[0].name)
            tokenizer.save_pretrained(holder[0].name)
        return LLM(holder[0].name, device=w.device, dtype=w.dtype, **opts)

    return make


def prepare(w: Workload, baselines: bool = True) -> Prepared:
    """The workload's model, prompts and LLM factory. A quantized run with no baseline to compare never
    holds the 16-bit model: batchgen creates random weights itself and quantizes them layer by layer (an
    FP8 mixture of experts fits a card its 16-bit weights would fill)."""
    from batchgen.llm import LLM

    device = resolve_device(w.device)
    holder: list = []
    if w.tensor_parallel > 1 or (w.quantization and not baselines and w.arch in ARCHS):
        return _prepare_sharded(w, device)
    if w.arch in ARCHS:
        model = build_random_model(w.arch, str(device), _torch_dtype(w.dtype), w.seed)
        tokenizer = load_tokenizer()
        fallback = _saved_fallback(w, model, tokenizer, holder)
    else:  # the embedded model or a local directory, loaded by path as LLM would
        path = None if w.arch == EMBEDDED else w.arch
        loaded = load_model(path, device=str(device), dtype=w.dtype, attn_implementation="sdpa")
        model, tokenizer = loaded.model, loaded.tokenizer
        fallback = lambda **opts: LLM(path, device=str(device), dtype=w.dtype, **opts)  # noqa: E731
    prompts, warmup = _prompts(w, model, tokenizer, device)
    make = _llm_factory(model, tokenizer, fallback)
    return Prepared(w, model, tokenizer, make, prompts, warmup, device, holder[0] if holder else None)


def _prepare_sharded(w: Workload, device: torch.device) -> Prepared:
    """A model split over ``w.tensor_parallel`` GPUs (or one): a directory with only its config and
    tokenizer, loaded with random weights (each rank creates its own shard on its GPU); sizes come from
    a skeleton on the meta device."""
    from batchgen.llm import LLM
    from batchgen.model.build import meta_skeleton

    if w.arch not in ARCHS:
        raise ValueError(f"tensor-parallel workloads use a built-in architecture, not {w.arch!r}")
    tmp = tempfile.TemporaryDirectory(prefix="batchgen-bench-")
    config, tokenizer = arch_config(w.arch), load_tokenizer()
    config.save_pretrained(tmp.name)
    tokenizer.save_pretrained(tmp.name)
    skeleton = meta_skeleton(config)
    skeleton.to(_torch_dtype(w.dtype))

    def make(**opts):
        return LLM(tmp.name, load_format="random", tensor_parallel=w.tensor_parallel, dtype=w.dtype,
                   device=str(device), **opts)  # fmt: skip

    prompts, warmup = _prompts(w, skeleton, tokenizer, device)
    return Prepared(w, skeleton, tokenizer, make, prompts, warmup, device, tmp)


def _torch_dtype(name: str) -> torch.dtype:
    from batchgen.model.loader import resolve_dtype

    return resolve_dtype(name, torch.device("cpu"))


def _prompts(w: Workload, model, tokenizer, device: torch.device) -> tuple[list, list]:
    vocab = model.config.get_text_config().vocab_size
    if w.prompt_len:
        prompts = random_prompts(w.num_requests, w.prompt_len, vocab, w.seed)
    else:
        texts = text_prompts()
        texts = texts[: w.num_requests] if w.num_requests else texts
        prompts = [encode_prompt(tokenizer, t) for t in texts]
    # Warm-up prompts differ from the timed ones, so prefix caching cannot make the timed prefill free.
    if device.type == "cuda":
        n = min(len(prompts), _WAVE)
        warmup = random_prompts(n, max(1, round(sum(map(len, prompts)) / len(prompts))), vocab, w.seed + 1)
    else:
        warmup = random_prompts(1, 8, min(vocab, len(tokenizer)), w.seed + 1)
    return prompts, warmup


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run_mode(p: Prepared, mode: str) -> dict[str, Any]:
    w = p.workload
    if mode in ENGINE_MODES:
        llm = p.make_llm(async_mode=mode == "async", **w.engine_options)
        try:
            return runners.run_batchgen(
                llm, mode, p.prompts, w.max_new_tokens, p.warmup, w.json_schema, w.sampling
            )
        finally:
            llm.close()  # tensor-parallel workers release their GPUs before the next mode starts
            del llm
            free(p.device)
    if mode == "hf_forward":
        return _run_hf_forward(p)
    new = w.hf_max_new_tokens or w.max_new_tokens
    fn = {
        "generate_batch": runners.run_generate_batch,
        "hf_loop": runners.run_generate_loop,
        "hf_padded": runners.run_generate_padded,
    }[mode]
    record = fn(p.model, p.tokenizer, p.prompts, new)
    if new < w.max_new_tokens:
        notes = [record["note"], f"shorter decode: {new} new tokens (time budget)"]
        record["note"] = "; ".join(n for n in notes if n)
    return record


def _run_hf_forward(p: Prepared) -> dict[str, Any]:
    """batchgen's engine (async, CUDA graphs, paged attention) on transformers' modelling code: what the
    fused forward alone gains. On the first ``hf_num_requests`` requests; compared as rates."""
    w = p.workload
    n = w.hf_num_requests or len(p.prompts)
    new = w.hf_max_new_tokens or w.max_new_tokens
    llm = p.make_llm(async_mode=True, model_impl="transformers")
    try:
        record = runners.run_batchgen(llm, "hf_forward", p.prompts[:n], new, p.warmup[:n])
    finally:
        del llm
        free(p.device)
    record["engine"] = "transformers"
    record["note"] = f"batchgen engine, transformers' forward; first {n} requests, {new} new tokens"
    return record


def _safe_run(p: Prepared, mode: str, bandwidth: float, sizes: dict) -> dict[str, Any]:
    """``sizes``: the model's bytes as batchgen stores it ("batchgen") and as the baselines do ("hf")."""
    ours = mode in ENGINE_MODES
    try:
        record = run_mode(p, mode)
    except Exception as e:  # one failing mode must not lose the others' results
        engine = "batchgen" if mode in ENGINE_MODES else "transformers"
        record = runners.base_record(mode, engine, len(p.prompts), p.workload.max_new_tokens)
        record["error"] = f"{type(e).__name__}: {e}"
        free(p.device)
    if record.get("wall_s"):
        ideal = metrics.decode_ideal_s(
            sizes["batchgen" if ours else "hf"],
            record["requests"],
            p.mean_prompt_len,
            record["max_new_tokens"],
            min(record["requests"], record.get("max_num_seqs") or _WAVE),
            bandwidth,
        )
        record["roofline"] = ideal / record["wall_s"]
    record.update(workload=p.workload.name, shape=p.shape, device=str(p.device))
    record["bandwidth_gbs"] = bandwidth / 1e9
    if ours and p.workload.precision:
        record.update(p.workload.engine_options)
        record["note"] = "; ".join(n for n in (p.workload.precision, record["note"]) if n)
    return record


def modes_for(w: Workload, modes: list[str], compare_hf: bool) -> list[str]:
    """The engine modes asked for (default: async and sync; a whole-command workload: batchgen run as is),
    then the baselines: the workload's (generate_batch, or transformers' forward for B6), and beside
    generate_batch the hand-written ``model.generate`` loops on CPU only (on a GPU they would take longer
    than the rest together) and not as commands."""
    out = list(dict.fromkeys(modes or (["run"] if w.command else DEFAULT_MODES)))
    if compare_hf and w.tensor_parallel == 1:  # a split model exists whole in no process
        loops = w.device == "cpu" and "generate_batch" in w.baselines and not w.command
        extra = list(w.baselines) + (["hf_loop", "hf_padded"] if loops else [])
        out += [m for m in extra if m not in out]
    return out


def run_command_workload(w: Workload, modes: list[str], compare_hf: bool, opts: CommandOptions):
    """B4: whole commands on the embedded model (``bench/whole_commands.py``)."""
    bad = [m for m in modes if m not in whole_commands.COMMAND_MODES]
    if bad or w.arch != EMBEDDED:
        raise ValueError(
            f"{w.name} runs whole commands on the embedded model: modes {whole_commands.COMMAND_MODES}"
        )
    on_cpu = w.device == "cpu"
    builtin = mixed_prompts(w.num_requests) if on_cpu else chat_prompts(w.num_requests)
    prompts = whole_commands.read_prompts(opts.prompts) if opts.prompts else builtin
    threads = f"{opts.threads} threads each" if opts.threads else "each command's default threads"
    log(f"{w.name}: whole commands, {len(prompts)} prompts, {threads}, {opts.repeat} round(s)")
    target = whole_commands.Target(w.device, w.dtype, flags=w.run_flags)
    row_tokens = staggered_lengths(len(prompts)) if w.staggered else None
    return whole_commands.run_command_workload(
        w.name, prompts, modes_for(w, modes, compare_hf), w.max_new_tokens, opts.threads, opts.repeat, target,
        row_tokens,
    )  # fmt: skip


def run_workload(
    w: Workload, modes: list[str], compare_hf: bool = True, opts: CommandOptions | None = None
) -> list[dict[str, Any]]:
    if w.command:
        return run_command_workload(w, modes, compare_hf, opts or CommandOptions())
    log(f"{w.name}: preparing {w.arch} on {w.device} ({w.dtype})")
    modes = modes_for(w, modes, compare_hf)
    p = prepare(w, baselines=any(m not in ENGINE_MODES for m in modes))
    bandwidth = metrics.measure_bandwidth(p.device) * w.tensor_parallel  # K GPUs read their shards at once
    sizes = {
        "batchgen": metrics.model_bytes(p.model, w.quantization, w.kv_cache_dtype),
        "hf": metrics.model_bytes(p.model),
    }
    log(f"{w.name}: {p.shape}; copy bandwidth {bandwidth / 1e9:.0f} GB/s")
    records = []
    if p.device.type == "cuda":
        _burn_in(p, modes[0], bandwidth, sizes)
    for mode in modes:
        record = _safe_run(p, mode, bandwidth, sizes)
        status = record["error"] or f"{record['wall_s']:.2f} s, {record['tok_s']:.1f} tok/s"
        if p.device.type == "cuda":  # what the next mode starts with: a leak shows up here
            status += f"; {torch.cuda.memory_allocated(p.device) / (1 << 30):.1f} GiB still allocated"
        log(f"{w.name} {mode}: {status}")
        records.append(record)
    del p
    free(resolve_device(w.device))
    return records


def _burn_in(p, mode: str, bandwidth: float, sizes) -> None:
    """One untimed run of the first mode before any timed one: whichever mode ran first on a fresh model
    had slower decode steps than the second, in either order, so the first timed mode would pay a warm-up
    the others do not (docs/results.md, "Figures behind code choices"). Capped at 1024 new tokens, so that B1
    (8192) does not run twice, and at one wave of requests (B2, B6: every step shape is met in the first
    wave)."""
    log(f"{p.workload.name}: burn-in ({mode}, untimed)")
    short = replace(p.workload, max_new_tokens=min(p.workload.max_new_tokens, _BURN_IN_TOKENS))
    _safe_run(replace(p, workload=short, prompts=p.prompts[:_WAVE]), mode, bandwidth, sizes)


def _command() -> str:
    """How this run was started: ``python -m batchgen.bench ...`` or ``batchgen bench ...``."""
    prog = sys.argv[0] if sys.argv else ""
    prog = "python -m batchgen.bench" if prog.endswith("__main__.py") else os.path.basename(prog) or "python"
    return " ".join([prog, shlex.join(sys.argv[1:])]).strip()


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        return f"{names[0]} ({len(names)} cores)"
    except (OSError, IndexError):
        return platform.processor() or "cpu"


def _header(device: str | None) -> dict[str, Any]:
    import transformers

    dev = resolve_device(device)
    machine = torch.cuda.get_device_name(dev) if dev.type == "cuda" else _cpu_name()
    return {
        "command": _command(),
        "machine": f"{machine}, {torch.get_num_threads()} CPU threads",
        "versions": f"torch {torch.__version__}, transformers {transformers.__version__}",
        "load_avg_1m_5m_15m": " ".join(f"{x:.1f}" for x in os.getloadavg()),
    }


def run_bench(
    workloads: list[str],
    modes: list[str],
    out_dir: str | None,
    quick: bool,
    compare_hf: bool,
    device: str | None,
    tensor_parallel: int | None = None,
    quantization: str | None = None,
    kv_cache_dtype: str = "auto",
    opts: CommandOptions | None = None,
    sampling: dict | None = None,
    **sizes: int | None,
) -> list[dict]:
    """Run each workload in each mode (plus the transformers baselines), print and write the tables.
    ``quantization`` / ``kv_cache_dtype``: FP8 for batchgen's runs (the baselines run the model as built);
    ``sampling``: more SamplingParams fields for batchgen's requests (the baselines sample greedily);
    ``sizes``: ``max_num_seqs`` / ``max_batch_tokens``, batchgen's width and tokens a step [the engine's]."""
    specs = [
        get_workload(name, device, tensor_parallel, quantization, kv_cache_dtype, sampling, **sizes)
        for name in workloads
    ]
    records: list[dict] = []
    for w in specs:
        w = quick_workload(w) if quick else w
        try:
            records += run_workload(w, modes, compare_hf, opts)
        except Exception as e:  # e.g. no CUDA device for a GPU workload: report it, run the rest
            failed = runners.base_record("-", "-", w.num_requests, w.max_new_tokens)
            failed.update(workload=w.name, shape=w.label, error=f"{type(e).__name__}: {e}")
            records.append(failed)
            log(f"{w.name}: {failed['error']}")
        if out_dir:  # after every workload: a run killed by a time limit keeps what it finished
            _write(records, out_dir)
    print(report.render(records), flush=True)
    if out_dir:
        log(f"wrote {', '.join(map(str, _write(records, out_dir)))}")
    return records


def _write(records: list[dict], out_dir: str) -> list:
    devices = [r["device"] for r in records if r.get("device")]
    return report.write(records, out_dir, _header(devices[0] if devices else "cpu"))
