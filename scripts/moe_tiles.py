"""The tile sweep and the tables of ``moe_split.py``: the two grouped GEMMs of a mixture-of-experts layer
under a grid of tiles per token count, against ``routed_experts``' own choice, and the whole layer with
each GEMM's best tiles. Run through ``moe_split.py`` (without ``--no-sweep``)."""

from __future__ import annotations

import argparse
import functools
import time
from typing import Any

from moe_layer import (
    NOT_COUNTED,
    PARTS,
    Layer,
    Shape,
    Step,
    cfg_name,
    current_config,
    expert_itemsize,
    kernels,
    launch,
    time_ms,
    whole_layer,
)


def candidates(experts: int, itemsize: int, weight_itemsize: int) -> list[dict]:
    """``tiles.config_for``'s own choices first (each mean group size's, each kernel's tiles), those of
    prompt-sized groups in each program order (GROUP_M), then the grid, with 256-column K tiles for 1-byte
    weights."""
    from batchgen.kernels.moe import tiles

    chosen = [tiles.config_for(experts * m, experts, itemsize, weight_itemsize) for m in (1, 17, 33, 129)]
    current = [kernels().kernel_tiles(cfg, kernel) for cfg in chosen for kernel in ("gate_up", "down")]
    grid = [  # every BLOCK_M of one (N, K, warps, stages) together: a sweep cut short still covers each
        dict(BLOCK_M=m, BLOCK_N=n, BLOCK_K=k, num_warps=w, num_stages=st)
        for n in (64, 128)
        for k in ((256, 128, 64) if weight_itemsize == 1 else (128, 64))
        for w in (4, 8)
        for st in (4, 3)
        for m in (16, 32, 64, 128)
    ]
    orders = [{**cfg, "GROUP_M": g} for cfg in current if cfg["BLOCK_M"] >= 64 for g in (0, 4, 8, 16)]
    out: list[dict] = []
    for cfg in current + orders + grid:
        if cfg not in out:
            out.append(cfg)
    return out


def fits(kernel: str, cfg: dict, itemsize: int, weight_itemsize: int, smem: int) -> bool:
    """Whether the staged tiles (A, and one or two weight tiles) fit shared memory, counted generously."""
    m, n, k = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    weight_tiles = 2 if kernel == "gate_up" else 1
    return cfg["num_stages"] * (m * k * itemsize + weight_tiles * k * n * weight_itemsize) <= smem


def applies(cfg: dict, s: Step, experts: int) -> bool:
    """BLOCK_M near the mean group: from an eighth of it up to four times it (16 at least)."""
    mean = s.ids.numel() / experts
    return cfg["BLOCK_M"] <= max(16, 4 * mean) and cfg["BLOCK_M"] * 8 >= mean


def sweep(layer: Layer, steps: dict[int, Step], configs: list[dict], env: dict) -> tuple[dict, dict]:
    """({tokens: {kernel: [{config, ms}]}}, notes): configs in order until the time budget is spent."""
    e, it, w_it = layer.gate_up.shape[0], layer.router.element_size(), expert_itemsize(layer)
    timed: dict[int, dict[str, list]] = {t: {"gate_up": [], "down": []} for t in steps}
    notes: dict[str, Any] = {"failed": [], "skipped_for_time": 0}
    t0 = time.perf_counter()
    for i, cfg in enumerate(configs):
        if time.perf_counter() - t0 > env["budget"]:
            notes["skipped_for_time"] = len(configs) - i
            break
        for t, s in steps.items():
            if not applies(cfg, s, e):
                continue
            for kernel in ("gate_up", "down"):
                if not fits(kernel, cfg, it, w_it, env["smem"]):
                    continue
                fn = functools.partial(launch, kernel, layer, s, cfg)
                try:
                    ms = time_ms(fn, env["device"], env["sweep_iters"], env["reps"])
                except Exception as exc:  # out of resources, or a tile Triton cannot build
                    notes["failed"].append(f"{t} {kernel} {cfg_name(cfg)}: {type(exc).__name__}")
                    continue
                timed[t][kernel].append({"config": cfg, "ms": ms})
    notes["seconds"] = time.perf_counter() - t0
    return timed, notes


def _ms_of(rows: list[dict], cfg: dict) -> float | None:
    return next((r["ms"] for r in rows if r["config"] == cfg), None)


def summarize(layer: Layer, s: Step, timed: dict[str, list], env: dict) -> dict:
    """Best tiles per kernel against the current ones, and the whole layer with each kernel's best."""
    cur = current_config(layer, s)
    out: dict[str, Any] = {"current": cur}
    for kernel, rows in timed.items():
        best = min(rows, key=lambda r: r["ms"], default=None)
        current_ms = _ms_of(rows, kernels().kernel_tiles(cur, kernel))
        out[kernel] = {"current_ms": current_ms, "best": best, "tried": len(rows), "timed": rows}
    if out["gate_up"]["best"] and out["down"]["best"]:
        cfg = {**out["gate_up"]["best"]["config"], "down": out["down"]["best"]["config"]}
        current_ms = time_ms(
            functools.partial(whole_layer, layer, s.h), env["device"], env["iters"], env["reps"]
        )
        best_fn = functools.partial(whole_layer, layer, s.h, cfg)
        layer_ms = time_ms(best_fn, env["device"], env["iters"], env["reps"])
        gemms_ms = out["gate_up"]["best"]["ms"] + out["down"]["best"]["ms"]
        out["joint"] = {
            "config": cfg,
            "gemms_ms": gemms_ms,
            "layer_ms": layer_ms,
            "current_layer_ms": current_ms,
        }
    return out


def print_sweep(sweeps: dict) -> None:
    print("\n| tokens | kernel | current | ms | best | ms | current / best |\n|---|---|---|---|---|---|---|")
    for t, s in sweeps.items():
        for kernel in ("gate_up", "down"):
            k = s[kernel]
            if k["best"] is None:
                continue
            cur = "n/a" if k["current_ms"] is None else f"{k['current_ms']:.4f}"
            ratio = "" if k["current_ms"] is None else f"{k['current_ms'] / k['best']['ms']:.2f}"
            print(f"| {t} | {kernel} | {cfg_name(s['current'])} | {cur} | {cfg_name(k['best']['config'])} | "
                  f"{k['best']['ms']:.4f} | {ratio} |")  # fmt: skip
        orders = _orders(s)
        if orders:
            print(f"| {t} | program orders (GROUP_M: ms) | {orders} |  |  |  |  |")
        if "joint" in s:
            j = s["joint"]
            cur, best = j["current_layer_ms"], j["layer_ms"]
            print(f"| {t} | whole layer | {cfg_name(s['current'])} | {cur:.4f} | {cfg_name(j['config'])} | "
                  f"{best:.4f} | {cur / best:.2f} |")  # fmt: skip


def _orders(s: dict) -> str:
    """Each kernel's current tiles timed in every program order (GROUP_M), e.g. "gate_up g0 0.91, g4 0.83"."""
    parts = []
    for kernel in ("gate_up", "down"):
        tiles = _without_order(kernels().kernel_tiles(s["current"], kernel))
        timed = s[kernel].get("timed", [])
        times = sorted(
            (r["config"].get("GROUP_M", 0), r["ms"]) for r in timed if _without_order(r["config"]) == tiles
        )
        if len(times) > 1:
            parts.append(f"{kernel} " + ", ".join(f"g{g} {ms:.4f}" for g, ms in times))
    return "; ".join(parts)


def _without_order(cfg: dict) -> dict:
    return {k: v for k, v in cfg.items() if k != "GROUP_M"}


def sweep_configs(layer: Layer, steps: dict[int, Step], shape: Shape, args: argparse.Namespace) -> list[dict]:
    configs = candidates(shape.experts, layer.router.element_size(), expert_itemsize(layer))
    configs = [c for c in configs if any(applies(c, s, shape.experts) for s in steps.values())]
    return configs[: args.max_configs] if args.max_configs else configs


def run_sweep(layer: Layer, steps: dict[int, Step], configs: list[dict], env: dict) -> tuple[dict, dict]:
    notes: dict[str, Any] = {"configs": len(configs)}
    timed, sweep_notes = sweep(layer, steps, configs, env)
    notes.update(sweep_notes)
    return {t: summarize(layer, steps[t], timed[t], env) for t in steps}, notes


# --- printing -----------------------------------------------------------------------------------------


def print_parts(results: dict) -> None:
    print("\n| tokens | part | ms | roofline ms | bound | x roofline |\n|---|---|---|---|---|---|")
    for t, r in results.items():
        for name in PARTS:
            p = r["parts"][name]
            print(f"| {t} | {name} | {p['ms']:.4g} | {p['roofline_ms']:.4g} | {p['bound']} | "
                  f"{p['vs_roofline']:.2f} |")  # fmt: skip
        print(f"| {t} | sum of parts | {r['sum_of_parts_ms']:.4g} | | | |")
    for t, r in results.items():
        print(f"{t} tokens: {r['distinct_experts']} experts hit, tiles {cfg_name(r['config'])}")


def print_estimate(rows: list[dict]) -> None:
    head = "| phase | waves | layer calls | " + " | ".join(f"{n} s" for n in PARTS)
    print(f"\n{head} | roofline s | tuned layer s |\n|" + "---|" * (len(PARTS) + 5))
    for r in rows:
        cells = " | ".join(f"{r[f'{n}_s']:.3f}" for n in PARTS)
        tuned = "" if r["tuned_layer_s"] is None else f"{r['tuned_layer_s']:.3f}"
        print(f"| {r['phase']} | {r['waves'] or ''} | {r['layer_calls']} | {cells} | "
              f"{r['roofline_s']:.3f} | {tuned} |")  # fmt: skip
    print(f"Not counted: {NOT_COUNTED}.")
