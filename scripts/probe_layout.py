"""Probe: decode attention with KV pages token-major ([blocks, block_size, Hkv, D], today) against
head-major ([blocks, Hkv, block_size, D]: one head's page is one contiguous run), same kernel via strides.

    PYTHONPATH=. python3 scripts/probe_layout.py
"""

from __future__ import annotations

import torch
from triton.testing import do_bench

from batchgen.kernels.decode import decode_attention
from scripts.probe_attention import inputs

for cache in ("fp8", "bf16"):
    for shape in ("32x4096", "256x1024"):
        batch, ctx = map(int, shape.split("x"))
        q, k, v, cu, lens, tables, scale = inputs(batch, ctx, cache)
        kh, vh = (x.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3) for x in (k, v))  # head-major storage
        kv_bytes = 2 * k.numel() * k.element_size() * (batch * ctx) / (k.shape[0] * k.shape[1])
        want = decode_attention(q, k, v, cu, lens, tables, scale, max_seq_len=ctx)
        for name, kk, vv in (("token-major", k, v), ("head-major", kh, vh)):
            for stages in (None, 3, 4, 5):
                for block_n in (None, 64):
                    run = lambda: decode_attention(q, kk, vv, cu, lens, tables, scale, max_seq_len=ctx,  # noqa: E731
                                                   num_stages=stages, block_n=block_n)  # fmt: skip
                    err = float((run().float() - want.float()).norm() / want.float().norm())
                    us = do_bench(run, rep=60) * 1e3
                    print(f"{cache} {shape} {name:11s} stages={stages} block_n={block_n}: {us:6.1f} us "
                          f"{kv_bytes / us / 1e3:5.0f} GB/s err {err:.1e}", flush=True)  # fmt: skip
