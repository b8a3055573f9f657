"""Probe: decode attention over an FP8 cache with swapped products on e4m3 tensor cores (wgmma).

S^T = K q^T ([tokens, group]: tokens fill wgmma's 64-row side, the GQA group its narrow one), softmax over
tokens, O^T = V^T P^T with V pages stored transposed ([blocks, Hkv, D, block_size]) so both products read
e4m3 straight from shared memory. Compared with decode_attention (V rows, tiles converted to fp16).

    PYTHONPATH=. python3 scripts/probe_swap.py [--shapes 32x4096 256x1024]
"""

from __future__ import annotations

import argparse
import os

import torch
import triton
import triton.language as tl

from batchgen.kernels.decode import LOG2E, _decode_merge_kernel, choose_num_splits, decode_attention, num_sms
from batchgen.kernels.fp8_quant import to_fp8


@triton.jit
def _swap_kernel(q_ptr, k_ptr, vt_ptr, part_acc_ptr, part_lse_ptr, seq_lens_ptr, bt_ptr, qk_scale, num_splits,
                 stride_qt, stride_qh, stride_kb, stride_ko, stride_kh, stride_vb, stride_vh, stride_vd, stride_bt,
                 NUM_Q_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_SIZE: tl.constexpr, ROUND: tl.constexpr):  # fmt: skip
    b, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    g, d = tl.arange(0, GROUP_PAD), tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + g
    q = tl.load(q_ptr + b * stride_qt + heads[:, None] * stride_qh + d[None, :], mask=g[:, None] < GROUP)
    q = q.to(tl.float32)
    q_scale = tl.maximum(tl.max(tl.abs(q), 1) / 448.0, 1e-30)  # [G]
    qt = tl.trans(to_fp8(q / q_scale[:, None], k_ptr.dtype.element_ty, ROUND))  # [D, G]
    split_tokens = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    lo = split * split_tokens
    hi = tl.minimum(lo + split_tokens, seq_len)
    acc = tl.zeros([HEAD_DIM, GROUP_PAD], dtype=tl.float32)  # O^T
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    bt_row = bt_ptr + b.to(tl.int64) * stride_bt
    PAGES: tl.constexpr = BLOCK_N // BLOCK_SIZE
    for start in range(lo, hi, BLOCK_N):
        start = tl.multiple_of(start, BLOCK_N)
        offs = start + tl.arange(0, BLOCK_N)
        valid = offs < hi
        page = tl.load(bt_row + offs // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
        rows = page * stride_kb + (offs % BLOCK_SIZE) * stride_ko + kv_head * stride_kh  # [N]
        k = tl.load(k_ptr + rows[:, None] + d[None, :], mask=valid[:, None], other=0.0)  # [N, D] e4m3
        st = tl.dot(k, qt) * q_scale[None, :]  # [N, G]
        st = tl.where(valid[:, None], st, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(st, 0) * qk_scale)
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_use)
        pt = tl.exp2(st * qk_scale - m_use[None, :])  # [N, G]
        l_i = l_i * alpha + tl.sum(pt, 0)
        pi, t = tl.arange(0, PAGES), tl.arange(0, BLOCK_SIZE)
        page_ok = start + pi * BLOCK_SIZE < hi  # [PAGES]
        pages = tl.load(bt_row + start // BLOCK_SIZE + pi, mask=page_ok, other=0).to(tl.int64)
        base = pages * stride_vb + kv_head * stride_vh
        vt = tl.load(vt_ptr + base[None, :, None] + (d * stride_vd)[:, None, None] + t[None, None, :],
                     mask=page_ok[None, :, None], other=0.0)  # [D, PAGES, BLOCK_SIZE]  # fmt: skip
        vt = tl.reshape(vt, (HEAD_DIM, BLOCK_N))
        p8 = to_fp8(pt * 256.0, vt.dtype, ROUND)
        acc = acc * alpha[None, :] + tl.dot(vt, p8)
        m_i = m_new
    has = l_i > 0
    out = tl.trans(acc / (256.0 * tl.where(has, l_i, 1.0))[None, :])  # [G, D]
    part = (b * NUM_Q_HEADS + heads) * num_splits + split
    tl.store(part_acc_ptr + part[:, None] * HEAD_DIM + d[None, :], out, mask=g[:, None] < GROUP)
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    tl.store(part_lse_ptr + part, lse, mask=g < GROUP)


def swap_attention(query, k_cache, vt_cache, cu, seq_lens, tables, scale, num_splits, block_n=128, gpad=8,
                   num_warps=4, num_stages=3):  # fmt: skip
    batch, q_heads, head_dim = query.shape
    kv_heads, block = k_cache.shape[2], k_cache.shape[1]
    part_acc = torch.empty((batch, q_heads, num_splits, head_dim), dtype=torch.float32, device=query.device)
    part_lse = torch.empty((batch, q_heads, num_splits), dtype=torch.float32, device=query.device)
    out = torch.empty_like(query)
    group = q_heads // kv_heads
    _swap_kernel[(batch, kv_heads, num_splits)](
        query, k_cache, vt_cache, part_acc, part_lse, seq_lens, tables, scale * LOG2E, num_splits,
        query.stride(0), query.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        vt_cache.stride(0), vt_cache.stride(1), vt_cache.stride(2), tables.stride(0),
        NUM_Q_HEADS=q_heads, GROUP=group, GROUP_PAD=max(gpad, group), HEAD_DIM=head_dim, BLOCK_N=block_n,
        BLOCK_SIZE=block, ROUND=query.device.type != "cuda", num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    _decode_merge_kernel[(batch, q_heads)](
        out, part_acc, part_lse, cu, out.stride(0), out.stride(1), num_splits, NUM_Q_HEADS=q_heads,
        HEAD_DIM=head_dim, SPLITS_PAD=triton.next_power_of_2(num_splits), num_warps=2,
    )  # fmt: skip
    return out


def main() -> None:
    from triton.testing import do_bench

    from scripts.probe_attention import inputs

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["32x4096", "256x1024"])
    args = ap.parse_args()
    for shape in args.shapes:
        batch, ctx = map(int, shape.split("x"))
        q, k, v, cu, lens, tables, scale = inputs(batch, ctx, "fp8")
        vt = v.permute(0, 2, 3, 1).contiguous()  # [blocks, Hkv, D, block_size]
        want = decode_attention(q, k, v, cu, lens, tables, scale, max_seq_len=ctx)
        kv_bytes = 2 * batch * ctx * k.shape[2] * k.shape[3]
        base = (
            do_bench(lambda: decode_attention(q, k, v, cu, lens, tables, scale, max_seq_len=ctx), rep=50)
            * 1e3
        )
        print(f"{shape}: today {base:.1f} us ({kv_bytes / base / 1e3:.0f} GB/s)", flush=True)
        s0 = choose_num_splits(batch, k.shape[2], ctx, num_sms(q.device))
        rows = []
        grid = [(bn, gp, 4, st) for bn in (64, 128) for gp in (8, 16) for st in (2, 3, 4)]
        grid += [(128, 8, 8, st) for st in (2, 3, 4)]
        for splits in sorted({s0, 2 * s0}):
            for block_n, gpad, warps, stages in grid:
                cfg = dict(block_n=block_n, gpad=gpad, num_warps=warps, num_stages=stages)
                try:
                    run = lambda: swap_attention(q, k, vt, cu, lens, tables, scale, splits, **cfg)  # noqa: E731
                    err = float((run().float() - want.float()).norm() / want.float().norm())
                    us = do_bench(run, rep=50) * 1e3
                except Exception as e:  # noqa: BLE001
                    print(f"  splits={splits} {cfg}: {type(e).__name__} {str(e)[:120]}", flush=True)
                    continue
                rows.append((us, f"splits={splits} {cfg}", err))
        for us, cfg, err in sorted(rows)[:10]:
            print(
                f"  {us:7.1f} us {kv_bytes / us / 1e3:5.0f} GB/s  {cfg}  rel err vs today {err:.1e}",
                flush=True,
            )


if __name__ == "__main__" and os.environ.get("TRITON_INTERPRET") != "1":
    main()
