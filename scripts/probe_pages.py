"""Probe: FP8-cache decode attention at page sizes 16..256 (same kernel), median of 3 rounds.

    PYTHONPATH=. python3 scripts/probe_pages.py
"""

from __future__ import annotations

import statistics

import torch
from triton.testing import do_bench

import scripts.probe_attention as pa
from batchgen.kernels.decode import decode_attention

for shape in ("32x4096", "256x1024"):
    batch, ctx = map(int, shape.split("x"))
    runs, times = {}, {}
    for cache in ("fp8", "bf16"):
        for block in (16, 32, 64, 128, 256):
            pa.BLOCK = block
            args = pa.inputs(batch, ctx, cache)
            for stages in (3, 5):
                for block_n in (64, 128):
                    kw = dict(num_stages=stages, block_n=block_n)
                    runs[f"{cache} page {block:3d} {kw}"] = lambda a=args, kw=kw: decode_attention(*a, max_seq_len=ctx, **kw)
    for _ in range(3):
        for name, run in runs.items():
            times.setdefault(name, []).append(do_bench(run, rep=40) * 1e3)
    print(shape)
    for name, t in times.items():
        print(f"  {statistics.median(t):7.1f} us  {name}", flush=True)
