"""FP8 building blocks on the GPU, for the choices in ``kernels/gemm/fp8_gemm.py`` and the fused quantization:

- matmuls at Llama-3-8B's projection shapes and decode / prefill row counts: bf16 ``F.linear`` vs FP8
  ``torch._scaled_mm`` (rowwise) vs the Triton kernel (rowwise; 128 x 128 blocks; weight-only) vs a
  weight dequantized to bf16 then ``F.linear``, with the weight-read rate at small M (a decode step is
  bound by it);
- activation quantization: RMSNorm then a separate quantization launch vs RMSNorm writing FP8 itself, and
  the same for SiLU-and-multiply.

    PYTHONPATH=. python3 scripts/bench_fp8.py --out fp8.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from batchgen.kernels import fp8_format as ref  # noqa: E402
from batchgen.kernels.fp8_format import ActQuant  # noqa: E402
from batchgen.kernels.gemm.dequant import dequantized_linear  # noqa: E402
from batchgen.kernels.gemm.fp8_gemm import triton_fp8_matmul  # noqa: E402
from batchgen.kernels.gemm.fp8_gemm_tma import SMALL_M  # noqa: E402
from batchgen.kernels.gemm.fp8_quant import quantize_act  # noqa: E402
from batchgen.kernels.layer_ops.activation import silu_mul  # noqa: E402
from batchgen.kernels.layer_ops.norm import rms_norm  # noqa: E402

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}


def bench_us(fn) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100) * 1e3


def _matmul_cases(x: torch.Tensor, w: torch.Tensor) -> dict:
    """The products to time for input x [M, K] and weight w [N, K] (operands quantized beforehand)."""
    wq, ws = ref.quantize_rows(w)
    bq, bs = ref.quantize_blocks(w, 128, 128)
    act, gact = quantize_act(x, ActQuant()), quantize_act(x, ActQuant(128))
    bf16 = torch.bfloat16
    return {
        "bf16": lambda: F.linear(x, w),
        "scaled_mm": lambda: torch._scaled_mm(
            act.data, wq.t(), scale_a=act.scale, scale_b=ws.view(1, -1), out_dtype=bf16
        ),
        "triton_rowwise": lambda: triton_fp8_matmul(act, wq, ws, bf16),
        "triton_block": lambda: triton_fp8_matmul(gact, bq, bs, bf16, group=128, scale_rows=128),
        # weight-only (--quantization fp8): e4m3 tiles widened in the kernel, or the whole weight
        # dequantized to bf16 for cuBLAS on every call
        "triton_w8a16": lambda: triton_fp8_matmul(x, wq, ws, bf16),
        "dequant_bf16": lambda: dequantized_linear(x, wq, ws),  # the package's widening kernel
        # the same by torch ops (session 61's "dequant_bf16": three passes, ~15 bytes a weight)
        "dequant_torch": lambda: F.linear(x, (wq.to(bf16) * ws.view(-1, 1)).to(bf16)),
    } | (
        {  # decode sizes: the TMA kernel on the 16-bit input, 128-wide whole-K tiles or 64-wide x 4 splits
            "tma_w8a16": lambda: triton_fp8_matmul(x, wq, ws, bf16, tma=True),
            "tma_w8a16_64x4": lambda: triton_fp8_matmul(x, wq, ws, bf16, tma=True, block_n=64, split_k=4),
        }
        if x.shape[0] <= SMALL_M
        else {}
    )


def matmuls(rows: list[int]) -> list[dict]:
    out = []
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        for m in rows:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            for impl, fn in _matmul_cases(x, w).items():
                us = bench_us(fn)
                weight_bytes = n * k * (2 if impl == "bf16" else 1)
                r = dict(kind="matmul", shape=name, m=m, n=n, k=k, impl=impl, us=us,
                         weight_gbs=weight_bytes / us / 1e3, tflops=2 * m * n * k / us / 1e6)  # fmt: skip
                print(f"{name:8s} M={m:5d} {impl:15s} {us:9.1f} us  {r['weight_gbs']:7.0f} GB/s weights  "
                      f"{r['tflops']:6.1f} TFLOP/s", flush=True)  # fmt: skip
                out.append(r)
    return out


def _quant_cases(m: int) -> dict:
    x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    gate_up = torch.randn(m, 2 * 14336, device="cuda", dtype=torch.bfloat16)
    token = ActQuant()
    return {
        "rms_norm": lambda: rms_norm(x, weight, 1e-5),
        "rms_norm + quantize": lambda: quantize_act(rms_norm(x, weight, 1e-5)[0], token),
        "rms_norm writing fp8": lambda: rms_norm(x, weight, 1e-5, None, token),
        "silu_mul": lambda: silu_mul(gate_up),
        "silu_mul + quantize": lambda: quantize_act(silu_mul(gate_up), token),
        "silu_mul writing fp8": lambda: silu_mul(gate_up, token),
    }


def quantization(rows: list[int]) -> list[dict]:
    out = []
    for m in rows:
        for impl, fn in _quant_cases(m).items():
            us = bench_us(fn)
            print(f"quant    M={m:5d} {impl:22s} {us:8.1f} us", flush=True)
            out.append(dict(kind="quant", m=m, impl=impl, us=us))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="*", default=[32, 256, 8192])
    ap.add_argument("--out")
    args = ap.parse_args()
    results = matmuls(args.rows) + quantization(args.rows)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
