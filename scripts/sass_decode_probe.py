"""Offline sm_90 SASS of FP8-cache decode attention: today's V page layout against a transposed one.

No GPU needed: Triton compiles for GPUTarget("cuda", 90) and ships ptxas and cuobjdump. The kernel below is
a stripped decode program (one split, no window; a GQA group of 4 padded to 16 rows, head_dim 128, 128-token
tiles, block size 16: B1's Llama-3-8B decode). It differs between the modes only in how V is read:

- ``rows``: V pages as K's, [blocks, block_size, Hkv, D] (today). The P @ V product needs token pairs per
  head-dim lane; they are D bytes apart, so every e4m3 value comes out of shared memory alone (LDS.U8).
- ``transposed``: V pages [blocks, Hkv, D, block_size], tokens contiguous; a tile is loaded as [D, pages,
  block_size] (16-byte runs, masked per page so the copies stay asynchronous), reshaped to [D, BLOCK_N].

    PYTHONPATH=. python3 scripts/sass_decode_probe.py            # the installed Triton
    PYTHONPATH=/tmp/t36:. python3 scripts/sass_decode_probe.py   # another one (pip install --target)

Prints, per mode and pipeline depth: registers a thread, shared memory, SASS instruction count and the
instructions that tell the story (LDS.U8, asynchronous copies, ldmatrix, converts, tensor-core products).
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import tempfile

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
SHOWN = ("HMMA", "LDS.U8", "LDGSTS", "LDSM", "LDG.E", "F2FP", "PRMT", "LOP3", "IMAD", "STL")


@triton.jit
def _probe_kernel(q_ptr, k_ptr, v_ptr, out_ptr, seq_lens_ptr, bt_ptr, qk_scale, stride_qt, stride_qh,
                  stride_kb, stride_ko, stride_kh, stride_vb, stride_vh, stride_vd, stride_bt,
                  GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_SIZE: tl.constexpr, TRANSPOSED_V: tl.constexpr):  # fmt: skip
    b, kv_head = tl.program_id(0), tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + b)
    g, d = tl.arange(0, GROUP_PAD), tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + g
    q = tl.load(q_ptr + b * stride_qt + heads[:, None] * stride_qh + d[None, :], mask=g[:, None] < GROUP)
    q = q.to(tl.float16)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], dtype=tl.float32)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    bt_row = bt_ptr + b.to(tl.int64) * stride_bt
    PAGES: tl.constexpr = BLOCK_N // BLOCK_SIZE
    for start in range(0, seq_len, BLOCK_N):
        start = tl.multiple_of(start, BLOCK_N)
        offs = start + tl.arange(0, BLOCK_N)
        valid = offs < seq_len
        page = tl.load(bt_row + offs // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
        rows = page * stride_kb + (offs % BLOCK_SIZE) * stride_ko + kv_head * stride_kh  # [BLOCK_N]
        k = tl.load(k_ptr + rows[:, None] + d[None, :], mask=valid[:, None], other=0.0).to(tl.float16)
        s = tl.where(valid[None, :], tl.dot(q, tl.trans(k)), float("-inf"))  # [GROUP_PAD, BLOCK_N]
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s * qk_scale - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if TRANSPOSED_V:
            pi, t = tl.arange(0, PAGES), tl.arange(0, BLOCK_SIZE)
            page_ok = start + pi * BLOCK_SIZE < seq_len  # [PAGES]: a per-page mask keeps 16-byte copies
            pages = tl.load(bt_row + start // BLOCK_SIZE + pi, mask=page_ok, other=0).to(tl.int64)
            base = pages * stride_vb + kv_head * stride_vh  # [PAGES]
            vt = tl.load(v_ptr + base[None, :, None] + (d * stride_vd)[:, None, None] + t[None, None, :],
                         mask=page_ok[None, :, None], other=0.0)  # [D, PAGES, BLOCK_SIZE]  # fmt: skip
            v = tl.trans(tl.reshape(vt, (HEAD_DIM, BLOCK_N)).to(tl.float16))  # [BLOCK_N, D]
        else:
            v = tl.load(v_ptr + rows[:, None] + d[None, :], mask=valid[:, None], other=0.0).to(tl.float16)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(out_ptr + b * stride_qt + heads[:, None] * stride_qh + d[None, :], out.to(tl.bfloat16),
             mask=g[:, None] < GROUP)  # fmt: skip


SIGNATURE = {
    **{name: "*bf16" for name in ("q_ptr", "out_ptr")}, "k_ptr": "*fp8e4nv", "v_ptr": "*fp8e4nv",
    "seq_lens_ptr": "*i32", "bt_ptr": "*i32", "qk_scale": "fp32",
    **{f"stride_{s}": "i32" for s in ("qt", "qh", "kb", "ko", "kh", "vb", "vh", "vd", "bt")},
}  # fmt: skip


def compile_sm90(transposed: bool, stages: int):
    constants = dict(GROUP=4, GROUP_PAD=16, HEAD_DIM=128, BLOCK_N=128, BLOCK_SIZE=16, TRANSPOSED_V=transposed)
    signature = {**SIGNATURE, **{name: "constexpr" for name in constants}}
    names = list(signature)
    # Pointers and strides divisible by 16, as Triton's launcher specializes them on a real cache.
    aligned = [n for n in SIGNATURE if n.endswith("_ptr") or "stride" in n]
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    source = ASTSource(_probe_kernel, signature, {(names.index(n),): v for n, v in constants.items()}, attrs)
    options = dict(num_warps=4, num_stages=stages)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def cuobjdump(kernel, flag: str) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        command = [os.path.join(BIN, "cuobjdump"), flag, f.name]
        return subprocess.run(command, capture_output=True, text=True, check=True).stdout


def main() -> None:
    print(f"triton {triton.__version__}")
    for transposed in (False, True):
        for stages in (3, 5):
            kernel = compile_sm90(transposed, stages)
            sass = cuobjdump(kernel, "-sass")
            ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", sass)
            counts = collections.Counter(ops)
            shown = {key: sum(n for op, n in counts.items() if op.startswith(key)) for key in SHOWN}
            registers = re.findall(r"REG:(\d+)", cuobjdump(kernel, "-res-usage"))
            mode = "transposed" if transposed else "rows"
            print(f"{mode:10s} stages {stages}: registers {registers[0]}, shared {kernel.metadata.shared} B, "
                  f"{len(ops)} instructions; " + ", ".join(f"{k} {v}" for k, v in shown.items()))  # fmt: skip


if __name__ == "__main__":
    main()
