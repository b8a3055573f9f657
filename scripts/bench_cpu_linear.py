"""fp32 projections on the CPU: MKL (``F.linear``) vs oneDNN with the plain and the packed weight
(``kernels/cpu/cpu_linear.py``), GFLOP/s at the embedded model's shapes over row counts.

    python scripts/bench_cpu_linear.py [--threads 2] [--rows 1 8 78 256 3299]
"""

from __future__ import annotations

import argparse
import time
from functools import partial

import torch
import torch.nn.functional as F

from batchgen.kernels.cpu import cpu_linear

SHAPES = {"qkv": (1728, 576), "gate_up": (3072, 576), "down": (576, 1536), "lm_head": (49152, 576)}


def seconds(fn, reps: int = 20) -> float:
    for _ in range(3):
        fn()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 78, 256, 3299])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print("shape      rows   MKL  plain  packed  (GFLOP/s)")
    for name, (out_f, in_f) in SHAPES.items():
        weight = torch.randn(out_f, in_f)
        packed = cpu_linear.PackedLinear(weight, None)
        for rows in args.rows:
            x = torch.randn(rows, in_f)
            flops = 2 * rows * out_f * in_f
            runs = (
                partial(F.linear, x, weight),
                partial(torch.ops.mkldnn._linear_pointwise, x, weight, None, "none", [], ""),
                partial(packed, x),
            )
            rates = [flops / seconds(fn) / 1e9 for fn in runs]
            print(f"{name:9s} {rows:5d} " + " ".join(f"{r:6.0f}" for r in rates))


if __name__ == "__main__":
    main()
