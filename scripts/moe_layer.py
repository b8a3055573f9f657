"""One mixture-of-experts layer on a device, for ``moe_split.py`` and ``moe_tiles.py``: its shapes, random
weights (16-bit, or e4m3 experts), a step's routed inputs, the package's launches of each part, and their
timing (CUDA graphs replayed between events, or wall time off the GPU)."""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PARTS = ("router", "permutation", "gate_up", "down", "combine", "layer")
NOT_COUNTED = (
    "attention (prefill FLOPs, decode KV reads), the QKV/O projections, norms, embedding, LM head and "
    "sampling, host work between steps, and steps mixing one wave's decodes with the next's prompts"
)
SMEM_DEFAULT = 232448  # a Hopper SM's opt-in shared memory per block


class Shape(NamedTuple):
    experts: int
    hidden: int
    inter: int
    top_k: int
    layers: int


B6 = Shape(experts=128, hidden=2048, inter=768, top_k=8, layers=48)
TINY = Shape(experts=8, hidden=64, inter=32, top_k=2, layers=2)


class Layer(NamedTuple):
    router: torch.Tensor  # [E, H]
    gate_up: Any  # [E, 2I, H]: a tensor, or batchgen's Fp8Experts (--fp8)
    down: Any  # [E, H, I]
    routing: Any  # batchgen.model.moe_layout.Routing


class Step(NamedTuple):
    h: torch.Tensor  # [T, H]
    weights: torch.Tensor  # [T, K]
    ids: torch.Tensor  # [T, K]
    counts: torch.Tensor  # [E] int32
    order: torch.Tensor  # [P] int32
    act: torch.Tensor  # [P, I]
    y: torch.Tensor  # [P, H]
    out: torch.Tensor  # [T, H]
    distinct: int  # experts at least one token is routed to


def kernels():
    """The MoE kernels' module, imported once TRITON_INTERPRET is settled (``main``)."""
    from batchgen.kernels.moe import routed_experts

    return routed_experts


# --- the layer and its inputs -------------------------------------------------------------------------


def make_layer(
    shape: Shape, device: torch.device, dtype: torch.dtype, gen: torch.Generator, fp8: str | None = None
) -> Layer:
    """Random weights; ``fp8`` "channel" or "block": the experts in e4m3 as ``--quantization fp8`` writes
    them (a scale per output row) or as FP8 checkpoints hold them (128 x 128 blocks); "channel-a8" /
    "block-a8": with e4m3 activations too (``Fp8Experts.act_fp8``, W8A8)."""
    from batchgen.kernels.moe import expert_format as fmt
    from batchgen.model.moe_layout import Routing

    def rand(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=gen, device=device, dtype=dtype).mul_(size[-1] ** -0.5)

    e, h, i = shape.experts, shape.hidden, shape.inter
    routing = Routing(num_experts=e, top_k=shape.top_k, renormalize=True, fp32_weights=False)
    gate_up, down = rand(e, 2 * i, h), rand(e, h, i)
    if fp8:
        blocks = functools.partial(fmt.quantize_blocks, block=(128, 128))
        as_fp8 = fmt.quantize_channels if fp8.startswith("channel") else blocks
        gate_up, down = as_fp8(gate_up, parts=2), as_fp8(down)
        if fp8.endswith("-a8"):
            gate_up, down = gate_up._replace(act_fp8=True), down._replace(act_fp8=True)
    return Layer(rand(e, h), gate_up, down, routing)


def route_layer(layer: Layer, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from batchgen.model.moe_layer import route

    return route(F.linear(h, layer.router), layer.routing)


def make_step(layer: Layer, tokens: int, gen: torch.Generator) -> Step:
    e, inter, hidden = layer.gate_up.shape[0], layer.down.shape[2], layer.down.shape[1]
    h = torch.randn(tokens, hidden, generator=gen, device=layer.router.device, dtype=layer.router.dtype)
    weights, ids = route_layer(layer, h)
    counts, order = kernels().group_by_expert(ids, e)
    pairs = ids.numel()
    act = torch.randn(pairs, inter, generator=gen, device=h.device, dtype=h.dtype)
    y = h.new_empty(pairs, hidden)
    distinct = int(ids.unique().numel())
    return Step(h, weights, ids, counts, order, act, y, torch.empty_like(h), distinct)


def launch(kernel: str, layer: Layer, s: Step, cfg: dict) -> None:
    cfg = kernels().kernel_tiles(cfg, kernel)
    if kernel == "gate_up":  # e4m3 activations (``act_fp8``): their quantization is part of the product
        x, scale = kernels().product_input(s.h, layer.gate_up)
        kernels().gate_up_into(x, layer.gate_up, s.counts, s.order, s.act, s.ids.shape[1], cfg, scale)
    else:
        a, scale = kernels().product_input(s.act, layer.down)
        kernels().down_into(a, layer.down, s.counts, s.order, s.y, cfg, scale)


def whole_layer(layer: Layer, h: torch.Tensor, cfg: dict | None = None) -> torch.Tensor:
    weights, ids = route_layer(layer, h)
    return kernels().moe_experts(h, weights, ids, layer.gate_up, layer.down, config=cfg)


def cfg_name(cfg: dict) -> str:
    """ "M32 N64 K128 w4 s3", and the down GEMM's own tiles after a "/" where it has them."""
    name = f"M{cfg['BLOCK_M']} N{cfg['BLOCK_N']} K{cfg['BLOCK_K']} w{cfg['num_warps']} s{cfg['num_stages']}"
    name += f" g{cfg['GROUP_M']}" if cfg.get("GROUP_M") else ""
    return name + (f" / down {cfg_name(kernels().kernel_tiles(cfg, 'down'))}" if "down" in cfg else "")


def expert_itemsize(layer: Layer) -> int:
    """Bytes an expert weight takes: 1 for e4m3 (``--fp8``), else the activations' dtype's."""
    return kernels().weight_of(layer.down).element_size()


def current_config(layer: Layer, s: Step) -> dict:
    return kernels().tile_config(s.h, s.ids, layer.gate_up, layer.down)


# --- timing -------------------------------------------------------------------------------------------


def time_ms(fn: Callable[[], object], device: torch.device, iters: int, reps: int) -> float:
    """Milliseconds a call of ``fn`` takes: on CUDA ``reps`` calls captured in one graph, replayed until
    ``iters`` calls ran, between events; elsewhere wall time over ``iters`` calls. One call first (it
    compiles the kernels, and a failing configuration raises here, outside any capture)."""
    fn()
    if device.type != "cuda":
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t0) / iters * 1e3
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    replays = max(1, iters // reps)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    del graph
    return start.elapsed_time(end) / (replays * reps)


def measure_peak_flops(device: torch.device, dtype: torch.dtype) -> float:
    """FLOP/s of a large square matmul (the dense rate a prefill GEMM can reach)."""
    n = 8192 if device.type == "cuda" else 256
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    ms = time_ms(lambda: torch.matmul(a, b), device, iters=20 if device.type == "cuda" else 3, reps=5)
    return 2 * n**3 / (ms * 1e-3)
