"""Two Nsight Systems kernel summaries side by side (``nsys stats --report cuda_gpu_kern_sum --format
csv``): each kernel's average time in both, the ratio, and its total in the second, largest totals first.
Used by scripts/b2_why.sh: B2's decode kernels in ``bench_step`` (first) against the whole run (second).

    python3 scripts/kernel_sums.py STEP.csv RUN.csv [--top 25]
"""

from __future__ import annotations

import argparse
import csv
from typing import NamedTuple


class KernelSum(NamedTuple):
    instances: int
    total_ns: float

    @property
    def avg_us(self) -> float:
        return self.total_ns / max(1, self.instances) / 1e3


def _column(header: list[str], *words: str) -> int:
    for i, name in enumerate(header):
        if all(w in name for w in words):
            return i
    raise SystemExit(f"no column with {words} in {header}")


def read_sums(path: str) -> dict[str, KernelSum]:
    """Kernel name -> (instances, total ns); rows of one name (several launch configs) are added up."""
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    header = next((i for i, r in enumerate(rows) if any("Total Time" in c for c in r)), None)
    if header is None:
        raise SystemExit(f"{path}: no kernel summary header (nsys stats cuda_gpu_kern_sum)")
    cols = rows[header]
    total, count, name = _column(cols, "Total Time"), _column(cols, "Instances"), _column(cols, "Name")
    sums: dict[str, KernelSum] = {}
    for r in rows[header + 1 :]:
        old = sums.get(r[name], KernelSum(0, 0.0))
        sums[r[name]] = KernelSum(old.instances + int(r[count]), old.total_ns + float(r[total]))
    return sums


def compare(first: dict[str, KernelSum], second: dict[str, KernelSum], top: int) -> list[str]:
    lines = [f"{'kernel':60s} {'avg us 1st':>10s} {'avg us 2nd':>10s} {'2nd/1st':>8s} {'2nd total ms':>12s}"]
    for name, s in sorted(second.items(), key=lambda kv: -kv[1].total_ns)[:top]:
        f = first.get(name)
        ratio = f"{s.avg_us / f.avg_us:8.3f}" if f and f.avg_us else f"{'-':>8s}"
        first_avg = f"{f.avg_us:10.2f}" if f else f"{'-':>10s}"
        lines.append(f"{name[:60]:60s} {first_avg} {s.avg_us:10.2f} {ratio} {s.total_ns / 1e6:12.1f}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("first")
    ap.add_argument("second")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    print("\n".join(compare(read_sums(args.first), read_sums(args.second), args.top)))


if __name__ == "__main__":
    main()
