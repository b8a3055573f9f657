"""scripts/kernel_sums.py: two Nsight Systems kernel summaries side by side."""

from __future__ import annotations

from scripts.kernel_sums import compare, read_sums

CSV = """Generating SQLite file from report
Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Name
60.0,{a},{n},1,1,1,1,0,_decode_split_kernel
30.0,{b},{n},1,1,1,1,0,"void cutlass::Kernel2<x, y>"
10.0,1000,2,500,500,500,500,0,_decode_split_kernel
"""


def test_kernel_sums_read_and_compare(tmp_path):
    first, second = tmp_path / "step.csv", tmp_path / "run.csv"
    first.write_text(CSV.format(a=99000, b=30000, n=10))
    second.write_text(CSV.format(a=120000, b=30000, n=10))
    sums = read_sums(str(second))
    assert sums["_decode_split_kernel"].instances == 12  # rows of one name add up
    assert sums["_decode_split_kernel"].avg_us == 121000 / 12 / 1e3
    lines = compare(read_sums(str(first)), sums, top=5)
    assert lines[1].startswith("_decode_split_kernel") and "1.210" in lines[1]  # 10.08 us vs 8.33 us
    assert "cutlass::Kernel2<x, y>" in lines[2] and "1.000" in lines[2]
