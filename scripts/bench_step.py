"""One decode step at a fixed context vs its roofline, batchgen's fused forward beside transformers'.

The step is what the engine replays: the decode CUDA graph of the batch's bucket (model forward,
paged attention, sampling), launched through the async runner on synthetic inputs (every sequence at
``--context`` tokens). GPU time per step comes from the runner's CUDA events; the roofline is the
bytes one step must move (weights + the KV it reads) over the bandwidth of a large device copy. For a
mixture-of-experts model the weights are those of the experts the step actually routes its tokens to
(recorded from the fused forward's router, real rows only) plus every other weight.

    PYTHONPATH=. python3 scripts/bench_step.py --preset B6 --preset B6w  # Qwen3-30B-A3B, 256|512 x 768
    PYTHONPATH=. python3 scripts/bench_step.py --preset B2 --prefill 16x512 --prefill 16x497+240x768
    PYTHONPATH=. python3 scripts/bench_step.py --preset B2 --kv-pool-gib 100 --scatter-blocks  # a run's pool
    PYTHONPATH=. python3 scripts/bench_step.py --preset B2 --context 769  # 7 tiles of 128 where 768 is 6

``--prefill`` also times eager steps: whole prompts, optionally beside decoding rows (B2's steps where a
wave's new prompts join its decodes). Timing starts once both slots' graphs are captured (the engine
captures a key on demand after eager uses, which would otherwise be timed as Python launches).

With FP8 (batchgen's forward) the roofline counts the projections at one byte a weight and the cache at
one byte an element.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from batchgen.bench import metrics  # noqa: E402
from batchgen.bench.workloads import ARCHS, build_random_model  # noqa: E402
from batchgen.engine.batch import StepInputs  # noqa: E402
from batchgen.engine.cuda_slots import SAMPLE_FIELDS, TOKEN_FIELDS  # noqa: E402
from batchgen.engine.step_sampling import SamplingFeatures  # noqa: E402
from batchgen.llm import LLM  # noqa: E402
from batchgen.model.loader import tokenizer_path  # noqa: E402
from batchgen.model.moe_layer import MoEMLP  # noqa: E402

PRESETS = {  # name -> (arch, batch, context, GPUs): B1 at 4K context, B3, B5, B6 at their mean context
    "B1": ("llama3-8b", 32, 4096, 1),
    "B2": ("llama3-8b", 256, 768, 1),  # one wave of B2 (max_num_seqs 256) halfway through its decode
    "B3": ("qwen3-0.6b", 256, 640, 1),
    "B5": ("llama3-70b", 64, 1024, 2),
    "B6": ("qwen3-30b-a3b", 256, 768, 1),  # B6 at --max-num-seqs 256 halfway through its decode
    "B6w": ("qwen3-30b-a3b", 512, 768, 1),  # B6 in one wave of 512 rows (the width a roomy KV pool picks)
    "B7": ("smollm2-135m", 256, 181, 1),  # the embedded model's shape halfway through B7 (53 + 256)
    "B7w": ("smollm2-135m", 1024, 181, 1),  # B7 at --max-num-seqs 1024
}


def decode_inputs(
    step_id: int, batch: int, context: int, block_size: int, blocks: np.ndarray | None = None
) -> StepInputs:
    """Every sequence decodes its token number ``context`` over its own run of blocks (greedy): the first
    of ``blocks`` (a run's blocks, in the order it hands them out), else consecutive ones."""
    per_seq = -(-context // block_size)
    blocks = np.arange(batch * per_seq, dtype=np.int32) if blocks is None else blocks
    tables = blocks[: batch * per_seq].reshape(batch, per_seq)
    last = context - 1
    slots = tables[:, last // block_size].astype(np.int64) * block_size + last % block_size
    r = np.arange(batch + 1)  # row r's token: 100 + r (distinct tokens: a MoE routes them apart)
    return greedy_step(step_id, 100 + r[:-1], np.full(batch, last), slots, r.astype(np.int32), tables, r[:-1])


def prefill_inputs(step_id: int, seqs: int, length: int, block_size: int) -> StepInputs:
    """``seqs`` prompts of ``length`` tokens, each prefilled whole into its own run of blocks (B2's
    steps: 16 x 512 = the 8192-token budget); the last token of each is sampled (greedy)."""
    tables = np.arange(seqs * -(-length // block_size), dtype=np.int32).reshape(seqs, -1)
    positions = np.tile(np.arange(length, dtype=np.int64), seqs)
    rows = np.repeat(np.arange(seqs), length)
    slots = tables[rows, positions // block_size].astype(np.int64) * block_size + positions % block_size
    cu = np.arange(seqs + 1, dtype=np.int32) * length
    tokens = 100 + (np.arange(seqs * length, dtype=np.int64) * 7919) % 30000
    return greedy_step(step_id, tokens, positions, slots, cu, tables, (cu[1:] - 1).astype(np.int64))


def greedy_step(step_id: int, tokens, positions, slots, cu, tables, logits_indices) -> StepInputs:
    """A step of these tokens (none carried over), each sampled row greedy, no penalty or statistics."""
    s, seq_lens = len(logits_indices), (positions[cu[1:] - 1] + 1).astype(np.int32)
    ints, floats, ones = np.zeros(s, np.int64), np.zeros(s, np.float32), np.ones(s, np.float32)
    return StepInputs(
        step_id, tokens, np.full(len(tokens), -1, np.int64), positions.astype(np.int64), slots, cu, seq_lens,
        tables, logits_indices.astype(np.int64), temperature=floats, top_p=ones, top_k=ints, min_p=floats,
        rng_keys=ints, rng_steps=ints, repetition_penalty=ones, presence_penalty=floats,
        frequency_penalty=floats, min_tokens=ints, state_rows=ints - 1, features=SamplingFeatures(),
        max_q_len=int(np.diff(cu).max()), max_seq_len=int(seq_lens.max()),
    )  # fmt: skip


def join_steps(first: StepInputs, second: StepInputs, block_size: int) -> StepInputs:
    """One step of both steps' rows (``first``'s, e.g. decodes, then ``second``'s), ``second``'s blocks
    moved past ``first``'s."""
    offset = int(first.block_tables.max()) + 1
    width = max(first.block_tables.shape[1], second.block_tables.shape[1])
    tables = [np.pad(t, ((0, 0), (0, width - t.shape[1]))) for t in (first.block_tables, second.block_tables)]
    second = second._replace(  # its indices as they read after first's rows and blocks
        slot_mapping=second.slot_mapping + offset * block_size,
        logits_indices=second.logits_indices + len(first.input_ids),
        cu_seqlens_q=second.cu_seqlens_q[1:] + first.cu_seqlens_q[-1],
    )
    rows = TOKEN_FIELDS + SAMPLE_FIELDS + ("cu_seqlens_q", "seq_lens")
    return first._replace(
        **{f: np.concatenate([getattr(first, f), getattr(second, f)]) for f in rows},
        block_tables=np.concatenate([tables[0], tables[1] + offset]),
        max_q_len=max(first.max_q_len, second.max_q_len),
        max_seq_len=max(first.max_seq_len, second.max_seq_len),
    )


def time_prefill(llm: LLM, make: Callable[[int], StepInputs], steps: int) -> dict:
    """GPU ms of an eager step of prompts (``make(step_id)``), as the engine runs it, after 2 warm-ups."""
    runner = llm._engine.runner
    for i in range(2):
        runner.fetch(runner.launch(make(i)))
    busy0, t0 = runner.gpu_busy_s, time.perf_counter()
    for i in range(2, 2 + steps):
        runner.fetch(runner.launch(make(i)))
    wall = time.perf_counter() - t0
    return {"gpu_ms": (runner.gpu_busy_s - busy0) / steps * 1e3, "wall_ms": wall / steps * 1e3}


def time_steps(llm: LLM, batch: int, context: int, steps: int, scatter: bool = False) -> dict:
    """``scatter``: the sequences' blocks drawn at random from the whole KV pool, as a long run's blocks
    end up (handed out least recently freed first), instead of one consecutive run."""
    runner = llm._engine.runner
    block = llm.config.block_size
    pool = llm.num_kv_blocks
    blocks = np.random.default_rng(0).permutation(pool).astype(np.int32) if scatter else None
    # Warm-up until each slot's key is captured: its first ``capture_after`` uses run eagerly (the engine
    # captures on demand), and timing those would measure Python launches, not the step.
    warm = 2 * (runner.capture_after + 2)
    for i in range(warm):
        runner.fetch(runner.launch(decode_inputs(i, batch, context, block, blocks)))
    busy0, t0 = runner.gpu_busy_s, time.perf_counter()
    prev = None
    for i in range(warm, warm + steps):  # the engine's pattern: launch step N, then fetch step N - 1
        handle = runner.launch(decode_inputs(i, batch, context, block, blocks))
        if prev is not None:
            runner.fetch(prev)
        prev = handle
    runner.fetch(prev)
    wall = time.perf_counter() - t0
    return {"gpu_ms": (runner.gpu_busy_s - busy0) / steps * 1e3, "wall_ms": wall / steps * 1e3}


def sharded_step(name: str, arch: str, batch: int, context: int, gpus: int, steps: int, bandwidth: float):
    """A decode step of a model split over ``gpus`` GPUs, against its roofline: each GPU reads its share
    of the weights and KV at full bandwidth, plus the step's all-reduces (2 per layer + the embedding's)
    timed alone on the job's own process group."""
    from batchgen.bench.harness import _prepare_sharded
    from batchgen.bench.workloads import Workload

    cfg = ARCHS[arch]
    reduces = 2 * cfg["num_hidden_layers"] + 1
    p = _prepare_sharded(Workload(name, arch, batch, context, 64, tensor_parallel=gpus), torch.device("cuda"))
    sizes = metrics.model_bytes(p.model)
    kv_bytes = int(batch * (context + 64) * sizes["kv_per_token"] / gpus * 1.05) + (64 << 20)
    llm = p.make_llm(max_num_seqs=batch, max_model_len=context + 64, kv_cache_bytes=kv_bytes,
                     extra={"progress": False})  # fmt: skip
    try:
        r = time_steps(llm, batch, context, steps)
        comm_ms = max(llm._engine.runner.time_all_reduce((batch, cfg["hidden_size"]), reduces))
        bytes_per_gpu = (sizes["weights"] + batch * context * sizes["kv_per_token"]) / gpus
        roofline_ms = bytes_per_gpu / bandwidth * 1e3 + comm_ms
        r.update(preset=name, arch=arch, batch=batch, context=context, impl="batchgen", gpus=gpus,
                 allreduce_ms=comm_ms, roofline_ms=roofline_ms, bandwidth_gbs=bandwidth / 1e9)  # fmt: skip
        r["vs_roofline"] = r["gpu_ms"] / roofline_ms
        print(
            f"{name} batchgen TP={gpus} {batch} x {context}: GPU {r['gpu_ms']:.3f} ms/step (rank 0), wall "
            f"{r['wall_ms']:.3f}; roofline {roofline_ms:.3f} ms ({comm_ms:.3f} of {reduces} all-reduces) -> "
            f"{r['vs_roofline']:.3f}x",
            flush=True,
        )  # printed before close: the figure survives a hang there
    finally:
        llm.close()
    return r


class RouteRecorder:
    """Keeps the expert ids every MoE layer's router produces, including those captured into CUDA
    graphs: a graph replay rewrites the same tensors, so after a step they hold that step's routing."""

    def __init__(self) -> None:
        self.ids: list[torch.Tensor] = []
        self._original = MoEMLP.route

    def __enter__(self) -> RouteRecorder:
        original, recorded = self._original, self.ids

        def route(mlp, h):
            weights, ids = original(mlp, h)
            recorded.append(ids)
            return weights, ids

        MoEMLP.route = route
        return self

    def __exit__(self, *exc) -> None:
        MoEMLP.route = self._original

    def routed_experts(self, batch: int, moe_layers: int) -> list[int]:
        """Distinct experts per layer over the ``batch`` real rows, from the graph of the step's bucket."""
        bucket = min(t.shape[0] for t in self.ids if t.shape[0] >= batch)
        last = [t for t in self.ids if t.shape[0] == bucket][-moe_layers:]
        return [int(t[:batch].unique().numel()) for t in last]


def expert_bytes(model: torch.nn.Module) -> tuple[int, int, int]:
    """(all experts' bytes, one expert's bytes, MoE layers) of a transformers MoE model (0s if dense)."""
    experts = [m.mlp.experts for m in model.model.layers if hasattr(m.mlp, "experts")]
    if not experts:
        return 0, 0, 0
    total = sum(p.numel() * p.element_size() for e in experts for p in e.parameters())
    return total, total // (len(experts) * experts[0].num_experts), len(experts)


def roofline_ms(model, sizes: dict, batch: int, context: int, bandwidth: float, routed: list[int]) -> float:
    """(weights + KV) / bandwidth; for a MoE, only the ``routed`` experts' weights (all of them when the
    routing is unknown: transformers' forward run alone)."""
    all_experts, one_expert, _ = expert_bytes(model)
    weights = sizes["weights"] - all_experts + sum(routed) * one_expert if routed else sizes["weights"]
    return (weights + batch * context * sizes["kv_per_token"]) / bandwidth * 1e3


def print_kernels(run: Callable[[], object], trace: str | None = None) -> None:
    """Where a step's GPU time goes: the kernels ``run`` launches by their total time; with ``trace``,
    also the timeline (Chrome trace) and the GPU's largest gaps between kernels."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
    table = prof.key_averages().table(
        sort_by="self_device_time_total", row_limit=30, max_name_column_width=70
    )
    print(table, flush=True)
    if trace:
        prof.export_chrome_trace(trace)
        print_gaps(trace)


def print_gaps(trace: str, top: int = 15) -> None:
    """The GPU's idle time between consecutive kernels (any stream) and the largest gaps, by neighbours."""
    events = json.loads(Path(trace).read_text())["traceEvents"]
    kernels = sorted(
        (e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda e: e["ts"]
    )
    if not kernels:
        return
    gaps, end = [], kernels[0]["ts"]
    for prev, cur in zip(kernels, kernels[1:], strict=False):
        end = max(end, prev["ts"] + prev["dur"])
        if cur["ts"] > end:
            gaps.append((cur["ts"] - end, prev["name"][:50], cur["name"][:50]))
    span = kernels[-1]["ts"] + kernels[-1]["dur"] - kernels[0]["ts"]
    busy = sum(k["dur"] for k in kernels)
    idle = sum(g[0] for g in gaps)
    print(f"timeline {span / 1e3:.3f} ms, kernels {busy / 1e3:.3f} ms, gaps {idle / 1e3:.3f} ms", flush=True)
    for gap, before, after in sorted(gaps, reverse=True)[:top]:
        print(f"  gap {gap:9.1f} us  after {before}  before {after}", flush=True)


def parse_prefill(shape: str) -> tuple[int, int, int, int]:
    """``SEQSxLEN[+ROWSxCONTEXT]`` -> (seqs, length, rows, context)."""
    prompts, _, decodes = shape.lower().partition("+")
    seqs, length = (int(x) for x in prompts.split("x"))
    rows, context = (int(x) for x in decodes.split("x")) if decodes else (0, 0)
    return seqs, length, rows, context


def engine_size(batch: int, context: int, shapes: list[str]) -> tuple[int, int, int]:
    """(rows, longest sequence, KV tokens) for ``batch`` x ``context`` decodes and every prefill shape."""
    rows, longest, tokens = batch, context + 64, batch * (context + 64)
    for seqs, length, decodes, decode_context in map(parse_prefill, shapes):
        rows = max(rows, seqs + decodes)
        longest = max(longest, length + 64, decode_context + 64)
        tokens = max(tokens, seqs * (length + 64) + decodes * (decode_context + 64))
    return rows, longest, tokens


def prefill_line(llm: LLM, model, shape: str, label: str, profile: int) -> dict:
    """Time eager steps of ``shape``: SEQSxLEN prompts prefilled whole, optionally ``+ROWSxCONTEXT``
    decoding rows in the same step (a B2 step where a wave's new prompts join its decodes); print their
    GPU ms and the projections' TFLOP/s. ``profile``: then the kernels of that many steps."""
    seqs, length, rows, context = parse_prefill(shape)
    block = llm.config.block_size

    def make(i: int) -> StepInputs:
        step = prefill_inputs(i, seqs, length, block)
        return join_steps(decode_inputs(i, rows, context, block), step, block) if rows else step

    r = time_prefill(llm, make, steps=5)
    linear = sum(m.weight.numel() for n, m in model.named_modules() if isinstance(m, torch.nn.Linear))
    linear -= model.lm_head.weight.numel()  # the LM head reads only the sampled rows
    r["tflops"] = 2 * linear * len(make(0).input_ids) / max(r["gpu_ms"] * 1e-3, 1e-9) / 1e12
    line = f"{label} prefill {shape}: GPU {r['gpu_ms']:.2f} ms/step, wall {r['wall_ms']:.2f}; "
    print(line + f"{r['tflops']:.0f} TFLOP/s in the projections", flush=True)
    if profile:
        print_kernels(partial(time_prefill, llm, make, profile))
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", action="append", choices=list(PRESETS), help="repeatable [B1 B3]; B5: 2 GPUs")
    ap.add_argument("--impl", action="append", choices=["batchgen", "transformers"])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--context", type=int, help="each preset's decode context instead of its own")
    ap.add_argument("--quantization", choices=["fp8"], help="batchgen's forward only")
    ap.add_argument("--kv-cache-dtype", choices=["auto", "fp8"], default="auto", help="batchgen's only")
    ap.add_argument("--out", help="write the results as JSON to this file")
    ap.add_argument("--json", action="store_true", help="also print the results as JSON")
    ap.add_argument("--dump-after", type=float, default=280, help="print every thread's stack after S s")
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="then print the kernels of N steps")
    ap.add_argument("--trace", help="with --profile: write the Chrome trace here and print the GPU's gaps")
    ap.add_argument(
        "--kv-pool-gib", type=float, default=0, help="a KV pool this large (a run's: most of the GPU)"
    )
    ap.add_argument("--scatter-blocks", action="store_true", help="sequences' blocks at random over the pool")
    ap.add_argument(
        "--prefill",
        action="append",
        metavar="SEQSxLEN[+ROWSxCONTEXT]",
        help="also time eager steps of prompts [+ decodes]",
    )
    args = ap.parse_args()
    import faulthandler

    faulthandler.dump_traceback_later(args.dump_after, exit=False)  # where a hung run is stuck
    from transformers import AutoTokenizer

    device = torch.device("cuda")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path())
    bandwidth = metrics.measure_bandwidth(device)
    results = []
    for name in args.preset or ["B1", "B3"]:
        arch, batch, context, gpus = PRESETS[name]
        context = args.context or context
        if gpus > 1:
            results.append(sharded_step(name, arch, batch, context, gpus, args.steps, bandwidth))
            continue
        model = build_random_model(arch, "cuda", torch.bfloat16)
        moe_layers = expert_bytes(model)[2]
        routed: list[int] = []  # distinct experts per MoE layer, from the fused forward's step
        for impl in args.impl or ["batchgen", "transformers"]:
            fp8 = {"quantization": args.quantization, "kv_cache_dtype": args.kv_cache_dtype}
            fp8 = fp8 if impl == "batchgen" else {}
            sizes = metrics.model_bytes(model, **fp8)
            rows, longest, kv_tokens = engine_size(batch, context, args.prefill or [])
            kv_bytes = int(kv_tokens * sizes["kv_per_token"] * 1.05) + (64 << 20)
            kv_bytes = max(kv_bytes, int(args.kv_pool_gib * (1 << 30)))
            with RouteRecorder() as recorder:
                llm = LLM.from_model(
                    model, tokenizer, max_num_seqs=rows, max_model_len=longest, kv_cache_bytes=kv_bytes,
                    model_impl=impl, load_format="random", extra={"progress": False}, **fp8,
                )  # fmt: skip
                r = time_steps(llm, batch, context, args.steps, args.scatter_blocks)
            if moe_layers and recorder.ids:
                routed = recorder.routed_experts(batch, moe_layers)
            ideal = roofline_ms(model, sizes, batch, context, bandwidth, routed)
            r.update(preset=name, arch=arch, batch=batch, context=context, impl=impl,
                     roofline_ms=ideal, bandwidth_gbs=bandwidth / 1e9, **fp8)  # fmt: skip
            if moe_layers:
                r["routed_experts_mean"] = sum(routed) / len(routed) if routed else None
            r["vs_roofline"] = r["gpu_ms"] / ideal
            tag = "".join(f" {k}={v}" for k, v in fp8.items() if v not in (None, "auto"))
            line = f"{name} {impl:12s}{tag} {batch} x {context}: GPU {r['gpu_ms']:.3f} ms/step, "
            line += f"wall {r['wall_ms']:.3f} ms/step; roofline {ideal:.3f} ms -> {r['vs_roofline']:.3f}x"
            if moe_layers:
                line += f"; routed experts per layer {r['routed_experts_mean']}"
            print(line, flush=True)
            if args.profile:
                print_kernels(partial(time_steps, llm, batch, context, args.profile), args.trace)
            for shape in args.prefill or []:
                label = f"{name} {impl:12s}{tag}"
                r[f"prefill {shape}"] = prefill_line(llm, model, shape, label, args.profile)
            results.append(r)
            del llm
            gc.collect()
            torch.cuda.empty_cache()
        del model
        gc.collect()
        torch.cuda.empty_cache()
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
