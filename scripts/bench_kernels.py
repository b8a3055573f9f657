"""Benchmark the Triton paged-attention kernels on a GPU against measured ceilings.

Ceilings: device bandwidth from a large device-to-device copy (bytes read + written), bf16 matmul rate
from an 8192^3 product on random data. Then, for Llama-3-8B attention heads (32 q / 8 kv heads,
head_dim 128, bf16, block 16): decode at 32 x 8K and 256 x 1K contexts as KV bytes read per second vs
the copy bandwidth, and prefill of 4K-token chunks as causal FLOP/s vs the matmul rate. A small sweep of
launch configs runs first (``--no-sweep`` skips it); a correctness pass vs the torch reference runs last.

    PYTHONPATH=. python3 scripts/bench_kernels.py --out out/kernels.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from functools import partial
from pathlib import Path

import torch
import triton
from triton.testing import do_bench, do_bench_cudagraph

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from batchgen.kernels import reference  # noqa: E402
from batchgen.kernels.attention.decode import choose_num_splits, decode_attention  # noqa: E402
from batchgen.kernels.attention.dispatch import paged_attention_triton, write_kv  # noqa: E402
from batchgen.kernels.attention.prefill import default_prefill_config, prefill_attention  # noqa: E402
from batchgen.kernels.launch.device import num_sms  # noqa: E402
from tests.kernels.cases import make_case, rel_error  # noqa: E402

Q_HEADS, KV_HEADS, HEAD_DIM, BLOCK = 32, 8, 128, 16  # Llama-3-8B attention
DT = torch.bfloat16
DEV = "cuda"
DECODE_CASES = ((32, 8192), (256, 1024))  # (batch, context)
PREFILL_CASES = ((4096, 0), (4096, 4096), (1024, 0, 4))  # (chunk, tokens cached before it[, batch])
DECODE_CFGS = [  # (block_n, num_warps, num_stages); the first is the default
    (64, 4, 3), (32, 4, 2), (64, 8, 3), (128, 4, 2), (128, 8, 2),
]  # fmt: skip
DECODE_WAVES = [1, 2, 3, 4, 8]
PREFILL_CFGS = [  # (block_m, block_n, num_warps, num_stages); the default comes first
    (128, 64, 8, 3), (128, 128, 8, 2), (64, 64, 4, 3), (64, 128, 4, 3), (128, 32, 8, 3),
]  # fmt: skip


def bench_ms(fn, warmup: int = 20, rep: int = 100) -> float:
    """do_bench on the GPU (L2 flushed between runs); one wall-clock run under the CPU smoke test."""
    if DEV == "cuda":
        return do_bench(fn, warmup=warmup, rep=rep)
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def graph_us(fn) -> float | None:
    """Replay time of the call captured in a CUDA graph, as the engine runs it: proves it captures."""
    if DEV != "cuda":
        return None
    return do_bench_cudagraph(fn, rep=50) * 1e3


def copy_bandwidth(gib: float = 2.0) -> float:
    """Bytes read + written per second by a device-to-device copy of ``gib`` GiB."""
    src = torch.empty(int(gib * 2**30), dtype=torch.uint8, device=DEV)
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src), warmup=50, rep=300)
    return 2 * src.numel() / (ms * 1e-3)


def matmul_rate(n: int = 8192) -> tuple[float, float]:
    """bf16 FLOP/s on random data: sustained (do_bench, ~300 ms of products, the ceiling used) and burst
    (mean of 10 after 3 warm-ups, as KINDS.md measured; clocks drop under sustained load)."""
    a = torch.randn(n, n, device=DEV, dtype=DT)
    b = torch.randn(n, n, device=DEV, dtype=DT)
    sustained = 2 * n**3 / (bench_ms(lambda: a @ b, warmup=100, rep=300) * 1e-3)
    if DEV != "cuda":
        return sustained, sustained
    torch.cuda.synchronize()
    time.sleep(1.0)  # let the clocks recover
    for _ in range(3):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        a @ b
    end.record()
    end.synchronize()
    return sustained, 2 * n**3 * 10 / (start.elapsed_time(end) * 1e-3)


def paged_problem(q_lens: list[int], seq_lens: list[int], seed: int = 0) -> dict:
    """A big random problem built on the GPU (make_case builds on the CPU: too slow at these sizes)."""
    torch.manual_seed(seed)
    blocks = [-(-n // BLOCK) for n in seq_lens]
    num_blocks = sum(blocks)
    shape = (num_blocks, BLOCK, KV_HEADS, HEAD_DIM)
    k_cache = torch.randn(shape, device=DEV, dtype=DT)
    v_cache = torch.randn(shape, device=DEV, dtype=DT)
    perm = torch.randperm(num_blocks, device=DEV, dtype=torch.int64).to(torch.int32)
    tables = torch.zeros((len(seq_lens), max(blocks)), dtype=torch.int32, device=DEV)
    offsets = [0, *torch.tensor(blocks).cumsum(0).tolist()]
    for b, n in enumerate(blocks):  # shuffled, non-contiguous blocks per sequence
        tables[b, :n] = perm[offsets[b] : offsets[b] + n]
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=DEV)
    query = torch.randn((sum(q_lens), Q_HEADS, HEAD_DIM), device=DEV, dtype=DT)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEV)
    return dict(
        args=(query, k_cache, v_cache, cu, lens, tables, HEAD_DIM**-0.5), q_lens=q_lens, seq_lens=seq_lens
    )


def bench_decode(batch: int, ctx: int, bandwidth: float, sweep: bool) -> dict:
    prob = paged_problem([1] * batch, [ctx] * batch)
    args = prob["args"]
    kv_bytes = 2 * batch * ctx * KV_HEADS * HEAD_DIM * DT.itemsize
    sms = num_sms(torch.device(DEV))
    base = decode_attention(*args, max_seq_len=ctx)
    cfgs = [(bn, w, s, choose_num_splits(batch, KV_HEADS, ctx, sms)) for bn, w, s in DECODE_CFGS]
    cfgs += [(64, 4, 3, choose_num_splits(batch, KV_HEADS, ctx, sms, waves)) for waves in DECODE_WAVES]
    rows = []
    for bn, warps, stages, splits in dict.fromkeys(cfgs if sweep else cfgs[:1]):
        run = partial(decode_attention, *args, max_seq_len=ctx, num_splits=splits, block_n=bn,
                      num_warps=warps, num_stages=stages)  # fmt: skip
        err = rel_error(run(), base, batch)  # every config must agree with the default one
        ms = bench_ms(run)
        rows.append(dict(block_n=bn, num_warps=warps, num_stages=stages, num_splits=splits, us=ms * 1e3,
                         kv_GBps=kv_bytes / ms / 1e6, pct_bw=100 * kv_bytes / (ms * 1e-3) / bandwidth,
                         err_vs_default=err))  # fmt: skip
    best = max(rows, key=lambda r: r["pct_bw"])
    graph = graph_us(partial(decode_attention, *args, max_seq_len=ctx))
    return dict(name=f"decode {batch}x{ctx}", kv_bytes=kv_bytes, default=rows[0], best=best, sweep=rows,
                graph_us=graph)  # fmt: skip


def causal_flops(q_len: int, ctx_before: int) -> float:
    pairs = q_len * ctx_before + q_len * (q_len + 1) / 2  # visible (query, key) pairs
    return 4.0 * Q_HEADS * HEAD_DIM * pairs  # QK^T and PV, 2 FLOP per multiply-add


def bench_prefill(q_len: int, ctx_before: int, mm_rate: float, sweep: bool, batch: int = 1) -> dict:
    prob = paged_problem([q_len] * batch, [q_len + ctx_before] * batch)
    args = prob["args"]
    flops = batch * causal_flops(q_len, ctx_before)
    base = prefill_attention(*args)
    d = default_prefill_config(HEAD_DIM, DT)
    cfgs = [(d["block_m"], d["block_n"], d["num_warps"], d["num_stages"])] + PREFILL_CFGS
    rows = []
    for bm, bn, warps, stages in dict.fromkeys(cfgs if sweep else cfgs[:1]):
        run = partial(prefill_attention, *args, block_m=bm, block_n=bn, num_warps=warps, num_stages=stages)
        try:
            err = rel_error(run(), base, q_len * batch)
        except Exception as exc:  # e.g. out of shared memory for a large tile: skip that config
            rows.append(
                dict(block_m=bm, block_n=bn, num_warps=warps, num_stages=stages, error=repr(exc)[:200])
            )
            continue
        ms = bench_ms(run)
        rows.append(dict(block_m=bm, block_n=bn, num_warps=warps, num_stages=stages, ms=ms,
                         tflops=flops / (ms * 1e-3) / 1e12, pct_mm=100 * flops / (ms * 1e-3) / mm_rate,
                         err_vs_default=err))  # fmt: skip
    best = max((r for r in rows if "ms" in r), key=lambda r: r["pct_mm"])
    name = f"prefill {batch}x{q_len} after {ctx_before}"
    graph = graph_us(partial(prefill_attention, *args))
    return dict(name=name, flops=flops, default=rows[0], best=best, sweep=rows, graph_us=graph)


def bench_write_kv(tokens: int = 4096) -> dict:
    num_blocks = tokens // BLOCK * 4
    k_cache = torch.zeros((num_blocks, BLOCK, KV_HEADS, HEAD_DIM), device=DEV, dtype=DT)
    v_cache = torch.zeros_like(k_cache)
    key = torch.randn((tokens, KV_HEADS, HEAD_DIM), device=DEV, dtype=DT)
    value = torch.randn_like(key)
    slots = torch.randperm(num_blocks * BLOCK, device=DEV)[:tokens]
    ms = bench_ms(lambda: write_kv(k_cache, v_cache, key, value, slots))
    return dict(tokens=tokens, us=ms * 1e3, GBps=4 * key.numel() * DT.itemsize / ms / 1e6)


def correctness() -> list[dict]:
    """Moderate shapes vs the torch reference, through the dispatcher, all three dtypes."""
    tol = {torch.float32: 3e-3, torch.bfloat16: 2e-2, torch.float16: 5e-3}
    lens = [1000, 37, 2049, 512, 1, 700, 4100] if DEV == "cuda" else [40, 7, 65, 1]
    prefill_q = [300, 37, 1, 512, 1, 129, 1000] if DEV == "cuda" else [9, 7, 1, 1]
    # (dtype, q_heads, kv_heads, head_dim, sliding_window): bf16 over head shapes, fp16/fp32 on Llama's.
    cases = [
        (torch.bfloat16, 32, 8, 128, None),
        (torch.bfloat16, 9, 3, 64, None),
        (torch.bfloat16, 16, 4, 64, 256),
        (torch.bfloat16, 8, 8, 32, None),
        (torch.float16, 32, 8, 128, None),
        (torch.float32, 32, 8, 128, None),
    ]
    results = []
    for dtype, q_heads, kv_heads, head_dim, window in cases:
        for decode_only, q_lens in ((True, [1] * len(lens)), (False, prefill_q)):
            case = make_case(
                q_lens,
                lens,
                q_heads=q_heads,
                kv_heads=kv_heads,
                head_dim=head_dim,
                dtype=dtype,
                pad_rows=3,
                sliding_window=window,
                device=DEV,
                block_size=16 if decode_only else 32,
            )
            out = paged_attention_triton(
                *case.attn_args(), decode_only=decode_only, max_seq_len=8192, max_q_len=max(q_lens)
            )
            err = rel_error(out, reference.paged_attention(*case.attn_args()), case.num_valid_rows)
            results.append(
                dict(
                    dtype=str(dtype),
                    heads=(q_heads, kv_heads),
                    head_dim=head_dim,
                    window=window,
                    decode=decode_only,
                    err=err,
                    ok=err < tol[dtype],
                )
            )
    return results


def report(res: dict) -> None:
    print(f"\n{res['device']}  torch {res['torch']}  triton {res['triton']}")
    print(f"copy bandwidth {res['copy_GBps']:.0f} GB/s   bf16 matmul {res['matmul_TFLOPs']:.0f} TFLOP/s "
          f"sustained ({res['matmul_burst_TFLOPs']:.0f} burst)")  # fmt: skip
    print(f"{'case':<26}{'config (default -> best)':<44}{'time':>12}{'rate':>14}{'% ceiling':>11}")
    for r in res["decode"]:
        for tag in ("default", "best"):
            c = r[tag]
            cfg = f"{tag} bn{c['block_n']} w{c['num_warps']} s{c['num_stages']} splits{c['num_splits']}"
            print(f"{r['name']:<26}{cfg:<44}{c['us']:>10.1f}us{c['kv_GBps']:>9.0f} GB/s{c['pct_bw']:>10.1f}%")
    for r in res["prefill"]:
        for tag in ("default", "best"):
            c = r[tag]
            cfg = f"{tag} bm{c['block_m']} bn{c['block_n']} w{c['num_warps']} s{c['num_stages']}"
            rate = f"{c['tflops']:>7.0f} TFLOP/s"
            print(f"{r['name']:<26}{cfg:<44}{c['ms'] * 1e3:>10.1f}us{rate}{c['pct_mm']:>9.1f}%")
    graphs = ", ".join(
        f"{r['name']} {r['graph_us']:.1f}us" for r in res["decode"] + res["prefill"] if r["graph_us"]
    )
    print(f"default configs, CUDA-graph replay: {graphs}")
    w = res["write_kv"]
    print(f"write_kv {w['tokens']} tokens: {w['us']:.1f} us ({w['GBps']:.0f} GB/s)")
    bad = [c for c in res["correctness"] if not c["ok"]]
    worst = max(c["err"] for c in res["correctness"])
    print(f"correctness vs reference: {len(res['correctness']) - len(bad)}/{len(res['correctness'])} ok, "
          f"worst rel err {worst:.2e}")  # fmt: skip
    for c in bad:
        print("  FAILED", c)


def _smoke_shapes() -> None:
    """Shrink everything so the whole script runs in the CPU interpreter (catches Python errors)."""
    global \
        Q_HEADS, \
        KV_HEADS, \
        HEAD_DIM, \
        DEV, \
        DECODE_CASES, \
        PREFILL_CASES, \
        DECODE_CFGS, \
        PREFILL_CFGS, \
        DECODE_WAVES
    assert os.environ.get("TRITON_INTERPRET") == "1", "run the smoke test with TRITON_INTERPRET=1"
    Q_HEADS, KV_HEADS, HEAD_DIM, DEV = 4, 2, 16, "cpu"
    DECODE_CASES, PREFILL_CASES = ((2, 100),), ((40, 0), (8, 30, 2))
    DECODE_CFGS, PREFILL_CFGS, DECODE_WAVES = DECODE_CFGS[:2], PREFILL_CFGS[:2], DECODE_WAVES[:2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("out/kernels.json"))
    parser.add_argument("--no-sweep", action="store_true", help="time the default configs only")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (TRITON_INTERPRET=1)")
    opts = parser.parse_args()
    if opts.smoke:
        _smoke_shapes()
    t0 = time.time()
    name = torch.cuda.get_device_properties(0).name if DEV == "cuda" else "cpu (interpreter smoke test)"
    res = dict(device=name, torch=torch.__version__, triton=triton.__version__)
    res["copy_GBps"] = copy_bandwidth(1.0 if DEV == "cuda" else 2**-10) / 1e9
    sustained, burst = matmul_rate(8192 if DEV == "cuda" else 64)
    res["matmul_TFLOPs"], res["matmul_burst_TFLOPs"] = sustained / 1e12, burst / 1e12
    print(
        f"ceilings: {res['copy_GBps']:.0f} GB/s, {res['matmul_TFLOPs']:.0f} TFLOP/s ({time.time() - t0:.0f}s)"
    )
    sweep = not opts.no_sweep
    res["decode"] = []
    for batch, ctx in DECODE_CASES:
        res["decode"].append(bench_decode(batch, ctx, res["copy_GBps"] * 1e9, sweep))
        print(f"{res['decode'][-1]['name']} done ({time.time() - t0:.0f}s)", flush=True)
    res["prefill"] = []
    for q_len, ctx_before, *batch in PREFILL_CASES:
        res["prefill"].append(bench_prefill(q_len, ctx_before, res["matmul_TFLOPs"] * 1e12, sweep, *batch))
        print(f"{res['prefill'][-1]['name']} done ({time.time() - t0:.0f}s)", flush=True)
    res["write_kv"] = bench_write_kv(4096 if DEV == "cuda" else 16)
    res["correctness"] = correctness()
    res["seconds"] = time.time() - t0
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(json.dumps(res, indent=1, default=str))
    report(res)
    print(f"total {res['seconds']:.0f}s; json: {opts.out}")
    if not all(c["ok"] for c in res["correctness"]) or math.isnan(res["copy_GBps"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
