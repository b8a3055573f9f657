"""Tile sweeps for the FP8 decode path on a CUDA machine: paged decode attention over an e4m3 cache and
the Triton per-token x per-channel FP8 matmul at decode row counts, each beside what the forward runs
today (decode_attention's defaults; torch._scaled_mm). Prints one line per configuration, fastest first.

    PYTHONPATH=. python3 scripts/tune_fp8.py [--attention-shapes 32x4096 256x1024] [--caches fp8 bf16]
        [--heads 9,3,64]   # query heads, KV heads, head dim (default: Llama-3-8B's 32,8,128)
        [--kv-layouts token head]  # also pages stored head by head (by strides, as a layout A/B)
"""

from __future__ import annotations

import argparse
import time
from functools import partial

import torch
from triton.testing import do_bench, do_bench_cudagraph

from batchgen.kernels.attention import fp8_decode_cuda
from batchgen.kernels.attention.decode import choose_num_splits, decode_attention
from batchgen.kernels.attention.fp8_decode_cuda import LaunchShape
from batchgen.kernels.fp8_format import FP8, Fp8Act
from batchgen.kernels.gemm.fp8_gemm import triton_fp8_matmul
from batchgen.kernels.gemm.split_sums import summed
from batchgen.kernels.launch.device import num_sms
from scripts.probe_attention import DEFAULT_HEADS, inputs, parse_heads

GEMMS = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}


def attention(
    batch: int, ctx: int, cache: str, bandwidth: float, heads: tuple[int, int, int], impls: list[str],
    head_major: bool = False,
) -> None:  # fmt: skip
    """Paged decode attention over tiles x warps x stages x splits (Triton) and launch shapes x splits
    (the CUDA FP8 kernel), beside decode_attention's defaults; ``head_major``: pages stored head by head.

    Stages matter through Triton's pipeliner: the page lookup and the K/V tile it addresses form a chain
    of two loads, so ``num_stages = s`` keeps (s - 1) // 2 K/V tiles in flight per program (3 keeps one)."""
    args = inputs(batch, ctx, cache, heads, head_major)
    _, kv_heads, head_dim = heads
    kv_bytes = 2 * batch * ctx * kv_heads * head_dim * args[1].element_size()
    base_splits = choose_num_splits(batch, kv_heads, ctx, num_sms(args[0].device))
    want = decode_attention(*args, max_seq_len=ctx, num_stages=3)
    rows = []
    for cfg, run in _configs(args, ctx, base_splits, head_dim, cache, impls):
        try:
            err = float((run().float() - want.float()).norm() / want.float().norm())
            us = _graph_us(run)
        except Exception as e:  # noqa: BLE001 (a tile that does not fit shared memory)
            print(f"attn {cfg}: {type(e).__name__}: {str(e)[:200]}")
            continue
        rows.append((us, cfg, err))
    default_us = _graph_us(partial(decode_attention, *args, max_seq_len=ctx))
    pct = 100 * kv_bytes / (default_us * 1e-6) / bandwidth
    name = f"{batch} x {ctx} {cache} cache" + " (head-major pages)" * head_major
    print(f"attn {name}: default {default_us:.1f} us ({pct:.0f} % of copy bandwidth)")
    for us, cfg, err in sorted(rows)[:24]:
        print(f"  {us:7.1f} us {kv_bytes / us / 1e3:5.0f} GB/s  {cfg}  rel err {err:.1e}")


def _configs(args: tuple, ctx: int, base_splits: int, head_dim: int, cache: str, impls: list[str]):
    """(label, launch) pairs: the Triton kernel's tiles, and the CUDA kernel's shapes on an FP8 cache."""
    if "cuda" in impls and cache == "fp8":
        yield "triton default", partial(decode_attention, *args, max_seq_len=ctx, num_stages=5)
        t0 = time.perf_counter()  # a shape never compiled in this process (NVRTC, then the module load)
        fresh = LaunchShape(defines=f"// {args[0].shape[0]} x {ctx}\n")
        fp8_decode_cuda._kernel(args[0].get_device(), True, fresh)
        print(f"cuda kernel compile + load: {time.perf_counter() - t0:.2f} s")
        no_math = "#define NO_MATH\n"  # the copies alone: the ceiling of the kernel's access pattern
        shapes = [LaunchShape(4, 3, s) for s in (3, 4)] + [LaunchShape(4, 3, 4, defines=no_math)]
        shapes += [LaunchShape(4, 3, s, tma=True) for s in (3, 4)]
        shapes += [LaunchShape(4, 3, 4, defines=no_math, tma=True), LaunchShape(4, 2, 6, tma=True)]
        for shape in shapes:
            if shape.ring_bytes * shape.min_blocks > 228 * 1024:
                continue
            for splits in sorted({1, 2, base_splits}):
                run = partial(decode_attention, *args, max_seq_len=ctx, num_splits=splits, cuda_shape=shape)
                yield f"cuda {shape} splits={splits}", run
    if "triton" not in impls:
        return
    for block_n in (32, 64, 128):
        for warps in (2, 4, 8) if head_dim <= 64 else (4, 8):
            for stages in (3, 5, 7, 9):
                for splits in (base_splits, 2 * base_splits):
                    run = partial(decode_attention, *args, max_seq_len=ctx, block_n=block_n, num_warps=warps,
                                  num_stages=stages, num_splits=splits)  # fmt: skip
                    yield f"block_n={block_n} warps={warps} stages={stages} splits={splits}", run


def _graph_us(fn) -> float:
    """GPU time of one call, replayed from a CUDA graph as the engine runs it: no launch overhead (a
    ctypes launch takes longer than a 100 us kernel, and do_bench would time that)."""
    return do_bench_cudagraph(fn, rep=50) * 1e3


def matmul(m: int, bandwidth: float) -> None:
    """The Triton FP8 product, pointer and TMA kernels over tiles x K splits (x stages for TMA; None:
    the defaults, ``tma_shape`` / ``choose_split_k``'s pick), beside cuBLASLt's, each timed from graph
    replays over enough weight copies (> 150 MB) that L2 (50 MB on the H200) holds none of them between
    calls, as in a forward. Split products are timed without their sum, which the forward leaves to the
    next op (``kernels/gemm/split_sums.py``)."""
    total_default = total_best = 0.0
    for name, (n, k) in GEMMS.items():
        copies = max(2, -(-150_000_000 // (n * k)))
        a = Fp8Act(torch.randn((m, k), device="cuda").to(FP8), torch.rand((m, 1), device="cuda") + 0.5)
        ws = [torch.randn((n, k), device="cuda").to(FP8) for _ in range(copies)]
        scale = torch.rand(n, device="cuda") + 0.5
        want = torch._scaled_mm(a.data, ws[0].t(), scale_a=a.scale, scale_b=scale.view(1, n),
                                out_dtype=torch.bfloat16).float()  # fmt: skip

        rows = [(_rotated_us(partial(_scaled_mm, a, scale), ws), "scaled_mm", 0.0)]
        configs = [(None, None, None, None), (None, None, None, False), (None, None, None, True)]  # defaults
        splits = (1, 2, 3, 4, 6, 8)
        configs += [(bn, 4, sp, False) for bn in (32, 64) for sp in splits]
        configs += [(bn, st, sp, True) for bn in (64, 128) for st in (3, 4) for sp in splits]  # TMA
        for block_n, stages, split, tma in configs:
            run = partial(triton_fp8_matmul, a, scale=scale, dtype=torch.bfloat16, split_k=split,
                          block_n=block_n, num_stages=stages, tma=tma, summed=False)  # fmt: skip
            err = float((summed(run(weight=ws[0])).float() - want).norm() / want.norm())
            kernel = {None: "default", False: "pointer", True: "tma"}[tma]
            cfg = f"{kernel} block_n={block_n} stages={stages} split_k={split}"
            rows.append((_rotated_us(lambda w, run=run: run(weight=w), ws), cfg, err))
        print(f"gemm {name} M={m} N={n} K={k}: weights {n * k / 1e6:.1f} MB")
        for us, cfg, err in sorted(rows)[:10]:
            share = n * k / (us * 1e-6) / bandwidth
            print(f"  {us:7.1f} us {n * k / us / 1e3:5.0f} GB/s ({share:4.0%})  {cfg}  rel err {err:.1e}")
        total_default += rows[1][0]
        total_best += min(r[0] for r in rows)
    print(
        f"gemm layer (qkv, o, gate_up, down) M={m}: defaults {total_default:.1f} us, best {total_best:.1f} us"
    )


def _scaled_mm(a: Fp8Act, scale: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch._scaled_mm(
        a.data, w.t(), scale_a=a.scale, scale_b=scale.view(1, -1), out_dtype=torch.bfloat16
    )


def _rotated_us(run, weights: list[torch.Tensor]) -> float:
    """GPU time of one call, from graph replays of one call per weight copy."""
    return _graph_us(lambda: [run(w) for w in weights]) / len(weights)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=32, help="the matmuls' M (decode rows)")
    ap.add_argument("--attention-shapes", nargs="+", default=["32x4096", "256x1024"], help="BATCHxCONTEXT")
    ap.add_argument("--caches", nargs="+", choices=["fp8", "bf16"], default=["fp8"])
    ap.add_argument("--attention-impls", nargs="+", choices=["triton", "cuda"], default=["triton", "cuda"])
    ap.add_argument("--skip", choices=["attention", "matmul"], action="append", default=[])
    ap.add_argument("--kv-layouts", nargs="+", choices=["token", "head"], default=["token"],
                    help="pages stored token by token (the engine's) or head by head")  # fmt: skip
    ap.add_argument("--heads", default=",".join(map(str, DEFAULT_HEADS)), help="QUERY,KV,DIM heads")
    args = ap.parse_args()
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    bandwidth = 2 * src.numel() / (do_bench(lambda: dst.copy_(src), rep=50) * 1e-3)
    print(f"copy bandwidth {bandwidth / 1e9:.0f} GB/s")
    if "attention" not in args.skip:
        for shape in args.attention_shapes:
            batch, ctx = (int(x) for x in shape.split("x"))
            for cache in args.caches:
                for layout in args.kv_layouts:
                    attention(batch, ctx, cache, bandwidth, parse_heads(args.heads), args.attention_impls,
                              layout == "head")  # fmt: skip
    if "matmul" not in args.skip:
        matmul(args.rows, bandwidth)


if __name__ == "__main__":
    main()
