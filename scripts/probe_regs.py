"""Probe: FP8-cache decode attention with a register cap (more programs per SM), median of rounds.

    PYTHONPATH=. python3 scripts/probe_regs.py
"""

from __future__ import annotations

import statistics

import torch
from triton.testing import do_bench

from batchgen.kernels.decode import choose_num_splits, decode_attention, num_sms
from scripts.probe_attention import inputs

GRID = [(None, None, None, None)]  # defaults: 4 warps, 5 stages, 128-token tiles
GRID += [(8, 128, st, bn) for st in (3, 5) for bn in (64, 128)]
GRID += [(8, 96, st, 64) for st in (3, 5)] + [(8, 80, 5, 64), (8, 112, 5, 64)]
GRID += [(4, 128, 5, 64), (4, 128, 3, 64), (4, 168, 5, 64), (4, 160, 5, 128), (4, 104, 5, 64)]

for shape in ("32x4096", "256x1024", "32x8192"):
    batch, ctx = map(int, shape.split("x"))
    q, k, v, cu, lens, tables, scale = inputs(batch, ctx, "fp8")
    kv_bytes = 2 * batch * ctx * k.shape[2] * k.shape[3]
    want = decode_attention(q, k, v, cu, lens, tables, scale, max_seq_len=ctx)
    s0 = choose_num_splits(batch, k.shape[2], ctx, num_sms(q.device))
    runs, times = {}, {}
    for warps, maxnreg, stages, block_n in GRID:
        for splits in sorted({s0, 2 * s0}) if warps else [None]:
            kw = dict(num_warps=warps or 4, maxnreg=maxnreg, num_stages=stages, block_n=block_n, num_splits=splits)
            run = lambda kw=kw: decode_attention(q, k, v, cu, lens, tables, scale, max_seq_len=ctx, **kw)  # noqa: E731
            err = float((run().float() - want.float()).norm() / want.float().norm())
            runs[str(kw)] = (run, err)
    for _ in range(3):
        for name, (run, _) in runs.items():
            times.setdefault(name, []).append(do_bench(run, rep=40) * 1e3)
    rows = sorted((statistics.median(t), name) for name, t in times.items())
    print(f"{shape} (default median {statistics.median(times[str(dict(num_warps=4, maxnreg=None, num_stages=None, block_n=None, num_splits=None))]):.1f} us)")
    for us, name in rows[:12]:
        print(f"  {us:7.1f} us {kv_bytes / us / 1e3:5.0f} GB/s  {name}  err {runs[name][1]:.1e}", flush=True)
