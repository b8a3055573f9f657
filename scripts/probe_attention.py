"""Launch the paged decode attention at B1's shape (Llama-3-8B heads, 32 x 4K, 16-token pages) a few
times, for a profiler to attach to (Nsight Compute) or for Triton's cache to keep the compiled kernel:

    ncu --clock-control none -k regex:_decode_split --launch-skip 3 --launch-count 1 --set full \
        python3 scripts/probe_attention.py --cache fp8
"""

from __future__ import annotations

import argparse

import torch
from triton.testing import do_bench

from batchgen.kernels.attention.decode import decode_attention
from batchgen.kernels.fp8_format import FP8

Q_HEADS, KV_HEADS, HEAD_DIM, BLOCK = 32, 8, 128, 16


DEFAULT_HEADS = (Q_HEADS, KV_HEADS, HEAD_DIM)


def inputs(
    batch: int, ctx: int, cache: str, heads: tuple[int, int, int] = DEFAULT_HEADS, head_major: bool = False
) -> tuple:
    """Random query, K/V caches in pages shuffled over the pool, block tables, cu_seqlens, lengths.
    heads: (query heads, KV heads, head dim). ``head_major``: each page stored [Hkv, BLOCK, D] (a head's
    tokens contiguous), seen through strides as the engine's [BLOCK, Hkv, D]."""
    q_heads, kv_heads, head_dim = heads
    blocks = batch * -(-ctx // BLOCK)
    dtype = FP8 if cache == "fp8" else torch.bfloat16
    stored = (blocks, kv_heads, BLOCK, head_dim) if head_major else (blocks, BLOCK, kv_heads, head_dim)
    caches = [torch.randn(stored, device="cuda").to(dtype) for _ in range(2)]
    if head_major:
        caches = [c.permute(0, 2, 1, 3) for c in caches]
    tables = torch.randperm(blocks, device="cuda", dtype=torch.int64).to(torch.int32).view(batch, -1)
    query = torch.randn((batch, q_heads, head_dim), device="cuda", dtype=torch.bfloat16)
    cu = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
    lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    return query, *caches, cu, lens, tables, head_dim**-0.5


def parse_heads(text: str) -> tuple[int, int, int]:
    """``QUERY,KV,DIM`` (e.g. ``9,3,64``) -> (query heads, KV heads, head dim)."""
    heads = tuple(int(x) for x in text.split(","))
    if len(heads) != 3 or heads[0] % heads[1]:
        raise SystemExit(f"--heads {text}: want QUERY,KV,DIM with KV dividing QUERY")
    return heads


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", choices=["fp8", "bf16"], default="fp8")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--launches", type=int, default=6)
    ap.add_argument("--heads", default=",".join(map(str, DEFAULT_HEADS)), help="QUERY,KV,DIM heads")
    args = ap.parse_args()
    heads = parse_heads(args.heads)
    run_args = inputs(args.batch, args.context, args.cache, heads)
    for _ in range(args.launches):
        decode_attention(*run_args, max_seq_len=args.context)
    torch.cuda.synchronize()
    us = do_bench(lambda: decode_attention(*run_args, max_seq_len=args.context), warmup=5, rep=30) * 1e3
    kv_bytes = 2 * args.batch * args.context * heads[1] * heads[2] * run_args[1].element_size()
    print(f"{args.cache} cache {args.batch} x {args.context}: {us:.1f} us, {kv_bytes / us / 1e3:.0f} GB/s")


if __name__ == "__main__":
    main()
