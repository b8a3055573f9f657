"""Where a mixture-of-experts layer's time goes: each part against its roofline, a tile sweep of the
grouped GEMMs, and the whole run's MoE time split into prefill and decode.

One MoE layer (B6's Qwen3-30B-A3B shape by default: 128 experts, top-8, hidden 2048, expert
intermediate 768, 48 layers) with random bf16 weights, routed from random hidden states through the
model's own ``route``. For each token count (decode steps of 256 and 512 rows, a prefill chunk of 8192
tokens) every part is captured in a CUDA graph and replayed: the router GEMM + softmax/top-k, the
permutation (``group_by_expert``), the gate|up GEMM, the down GEMM, the combine, and the whole layer
(router + ``moe_experts``). Each part's roofline is the larger of its bytes over the measured copy
bandwidth (the weights of the experts at least one token hits, read once, plus activations) and its
FLOPs over the measured dense matmul rate: bytes bind at decode, FLOPs at prefill.

The sweep times the two grouped GEMMs under a grid of tiles per token count (an expert whose group
exceeds BLOCK_M is cut into several row tiles, each re-reading that expert's weights), against
``routed_experts``' own choice (``tile_config``), and the whole layer with each GEMM's best tiles
(``moe_experts(config=...)``, the down GEMM's under ``"down"``). The estimate multiplies the per-layer
times out to a run: prompts in chunks of ``--chunk`` tokens, decode steps times waves
(``ceil(requests / width)``) times layers.

    PYTHONPATH=. python3 scripts/moe_split.py --out split.json          # B6 shape, on the GPU
    TRITON_INTERPRET=1 PYTHONPATH=. python3 scripts/moe_split.py --device cpu --tiny   # a smoke test

Each part is launched by the package's own functions (``gate_up_into``, ``down_into``, ``combine_into``):
what is timed is what ``moe_experts`` runs.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
from collections.abc import Callable
from pathlib import Path

import torch
from moe_layer import (  # beside this script; it puts the repository on the path
    B6,
    NOT_COUNTED,
    PARTS,
    SMEM_DEFAULT,
    TINY,
    Layer,
    Shape,
    Step,
    current_config,
    expert_itemsize,
    kernels,
    launch,
    make_layer,
    make_step,
    measure_peak_flops,
    route_layer,
    time_ms,
    whole_layer,
)

# --- the parts and their rooflines --------------------------------------------------------------------


def part_costs(layer: Layer, shape: Shape, s: Step) -> dict[str, tuple[int, int]]:
    """(bytes, FLOPs) each part must move and compute: the hit experts' weights read once, the router's
    weight, activations in and out once."""
    e, h, i, k = shape.experts, shape.hidden, shape.inter, shape.top_k
    t, it = s.h.shape[0], s.h.element_size()
    p, w_it, id_it = t * k, s.weights.element_size(), s.ids.element_size()
    down_w = s.distinct * h * i * expert_itemsize(layer)  # e4m3 scales not counted
    gate_up_w = 2 * down_w
    return {
        "router": (e * h * it + t * h * it + p * (w_it + id_it), 2 * t * h * e),
        "permutation": (p * id_it + p * 4, 0),
        "gate_up": (gate_up_w + t * h * it + p * i * it, 2 * p * h * 2 * i),
        "down": (down_w + p * i * it + p * h * it, 2 * p * i * h),
        "combine": (p * h * it + p * w_it + t * h * it, 2 * p * h),
        "layer": (e * h * it + gate_up_w + down_w + 2 * t * h * it, 2 * t * h * e + 6 * p * i * h),
    }


def roofline(nbytes: int, flops: int, bandwidth: float, peak: float) -> dict:
    by_bytes, by_flops = nbytes / bandwidth * 1e3, flops / peak * 1e3
    return {
        "bytes": nbytes,
        "flops": flops,
        "roofline_ms": max(by_bytes, by_flops),
        "bound": "bytes" if by_bytes >= by_flops else "flops",
    }


def part_fns(layer: Layer, s: Step, cfg: dict) -> dict[str, Callable[[], object]]:
    e = layer.gate_up.shape[0]
    return {
        "router": functools.partial(route_layer, layer, s.h),
        "permutation": functools.partial(kernels().group_by_expert, s.ids, e),
        "gate_up": functools.partial(launch, "gate_up", layer, s, cfg),
        "down": functools.partial(launch, "down", layer, s, cfg),
        "combine": functools.partial(kernels().combine_into, s.y, s.weights, s.out),
        "layer": functools.partial(whole_layer, layer, s.h),
    }


def time_parts(layer: Layer, shape: Shape, s: Step, env: dict) -> dict:
    cfg = current_config(layer, s)
    costs = part_costs(layer, shape, s)
    parts = {}
    for name, fn in part_fns(layer, s, cfg).items():
        ms = time_ms(fn, env["device"], env["iters"], env["reps"])
        line = roofline(*costs[name], env["bandwidth"], env["peak"])
        parts[name] = {"ms": ms, **line, "vs_roofline": ms / line["roofline_ms"]}
    return {
        "tokens": s.h.shape[0],
        "pairs": s.ids.numel(),
        "distinct_experts": s.distinct,
        "config": cfg,
        "parts": parts,
        "sum_of_parts_ms": sum(parts[n]["ms"] for n in PARTS[:-1]),
    }


# --- the run estimate ---------------------------------------------------------------------------------


def phase_row(label: str, per_layer: dict, calls: int, waves: int | None, tuned_ms: float | None) -> dict:
    """Seconds over ``calls`` layer calls: each part, the whole layer, its roofline, and with tuned tiles."""
    parts = per_layer["parts"]
    row = {"phase": label, "tokens_per_step": per_layer["tokens"], "waves": waves, "layer_calls": calls}
    row.update({f"{n}_s": parts[n]["ms"] * calls / 1e3 for n in PARTS})
    row["roofline_s"] = parts["layer"]["roofline_ms"] * calls / 1e3
    row["tuned_layer_s"] = None if tuned_ms is None else tuned_ms * calls / 1e3
    return row


def estimate(results: dict, sweeps: dict, shape: Shape, args: argparse.Namespace) -> list[dict]:
    """B6's MoE time: the prompts in chunks of ``--chunk`` tokens, then each decode width's steps times
    its waves, every one through ``layers`` layers."""

    def tuned(t: int) -> float | None:
        return sweeps.get(t, {}).get("joint", {}).get("layer_ms")

    rows = []
    if args.chunk in results:
        chunks = math.ceil(args.requests * args.prompt / args.chunk)
        rows.append(phase_row("prefill", results[args.chunk], chunks * shape.layers, None, tuned(args.chunk)))
    for t in sorted(x for x in results if x != args.chunk):
        waves = math.ceil(args.requests / t)
        calls = waves * args.generate * shape.layers
        rows.append(phase_row(f"decode at {t} rows", results[t], calls, waves, tuned(t)))
    return rows


# --- main ---------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", help="tokens a step [256 512 8192; --tiny: 4 16]")
    ap.add_argument("--chunk", type=int, help="prefill tokens a step, one of --tokens [8192; --tiny: 16]")
    for name, default in B6._asdict().items():
        ap.add_argument(f"--{name.replace('_', '-')}", type=int, help=f"[{default}]")
    ap.add_argument("--requests", type=int, default=512)
    ap.add_argument("--prompt", type=int, default=512, help="prompt tokens a request")
    ap.add_argument("--generate", type=int, default=512, help="generated tokens a request")
    ap.add_argument("--iters", type=int, help="timed calls a part [CUDA 50, else 2]")
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--sweep-budget", type=float, default=60.0, help="seconds of sweep at most")
    ap.add_argument("--max-configs", type=int, help="tile configurations at most [--tiny: 2]")
    ap.add_argument("--peak-tflops", type=float, help="dense matmul rate instead of measuring it")
    ap.add_argument("--device", default="cuda")
    ap.add_argument(
        "--tiny", action="store_true", help="a tiny layer (8 experts, hidden 64) at 4 and 16 tokens"
    )
    ap.add_argument(
        "--fp8",
        choices=("channel", "block", "channel-a8", "block-a8"),
        help="e4m3 experts, scaled per row or 128 x 128 block; -a8: e4m3 activations too (W8A8)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)
    preset = TINY if args.tiny else B6
    for name, default in preset._asdict().items():
        setattr(args, name, getattr(args, name) or default)
    args.tokens = args.tokens or ([4, 16] if args.tiny else [256, 512, 8192])
    args.chunk = args.chunk or (16 if args.tiny else 8192)
    args.max_configs = args.max_configs or (2 if args.tiny else None)
    return args


def environment(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> dict:
    from batchgen.bench import metrics

    cuda = device.type == "cuda"
    smem = SMEM_DEFAULT
    if cuda:
        smem = getattr(torch.cuda.get_device_properties(device), "shared_memory_per_block_optin", smem)
    peak = args.peak_tflops * 1e12 if args.peak_tflops else measure_peak_flops(device, dtype)
    iters = args.iters or (50 if cuda else 2)
    return {
        "device": device,
        "bandwidth": metrics.measure_bandwidth(device),
        "peak": peak,
        "iters": iters,
        "sweep_iters": max(1, iters // 2) if cuda else 1,
        "reps": 10 if cuda else 1,
        "budget": args.sweep_budget,
        "smem": smem,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type != "cuda":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # read when triton is first imported, just below
    dtype = torch.bfloat16
    shape = Shape(args.experts, args.hidden, args.inter, args.top_k, args.layers)
    gen = torch.Generator(device=device).manual_seed(args.seed)
    env = environment(args, device, dtype)
    rates = f"copy bandwidth {env['bandwidth'] / 1e9:.0f} GB/s, matmul {env['peak'] / 1e12:.1f} TFLOP/s"
    print(f"{shape}; {rates}", flush=True)
    layer = make_layer(shape, device, dtype, gen, args.fp8)
    steps = {t: make_step(layer, t, gen) for t in args.tokens}
    from moe_tiles import print_estimate, print_parts, print_sweep, run_sweep, sweep_configs  # beside this

    configs = [] if args.no_sweep else sweep_configs(layer, steps, shape, args)
    results = {t: time_parts(layer, shape, s, env) for t, s in steps.items()}
    print_parts(results)
    sweeps, sweep_notes = run_sweep(layer, steps, configs, env) if configs else ({}, {})
    if sweeps:
        print_sweep(sweeps)
        print(f"sweep: {json.dumps(sweep_notes, default=str)[:1500]}")
    rows = estimate(results, sweeps, shape, args)
    if args.chunk not in results:
        print(f"no prefill row: --chunk {args.chunk} is not among --tokens")
    print_estimate(rows)
    if args.out:
        out = {
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "shape": shape._asdict(),
            "dtype": str(dtype),
            "fp8_experts": args.fp8,
            "bandwidth_gbs": env["bandwidth"] / 1e9,
            "peak_tflops": env["peak"] / 1e12,
            "per_layer": {str(t): r for t, r in results.items()},
            "sweep": {str(t): s for t, s in sweeps.items()},
            "sweep_notes": sweep_notes,
            "estimate": rows,
            "not_counted": NOT_COUNTED,
        }
        Path(args.out).write_text(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
