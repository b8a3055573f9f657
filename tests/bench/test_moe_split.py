"""scripts/moe_split.py at tiny shapes on the CPU (Triton's interpreter, wall-clock timing): every part of
the MoE layer is timed against a positive roofline, the
tile sweep runs its two configurations, and the run estimate has its prefill and decode rows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PARTS = ("router", "permutation", "gate_up", "down", "combine", "layer")


@pytest.mark.parametrize("fp8", [None, "block-a8"])  # 16-bit experts; e4m3 weights and activations
def test_moe_split_tiny_on_cpu(tmp_path, fp8):
    out = tmp_path / "split.json"
    env = dict(
        os.environ,
        TRITON_INTERPRET="1",
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    )
    cmd = [
        sys.executable,
        str(ROOT / "scripts" / "moe_split.py"),
        "--device",
        "cpu",
        "--tiny",
        "--out",
        str(out),
        *(["--fp8", fp8] if fp8 else []),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    data = json.loads(out.read_text())
    assert set(data["per_layer"]) == {"4", "16"}
    for tokens, layer in data["per_layer"].items():
        for name in PARTS:
            part = layer["parts"][name]
            assert part["ms"] > 0 and part["roofline_ms"] > 0 and part["vs_roofline"] > 0, (tokens, name)
    assert data["sweep_notes"]["configs"] == 2
    for tokens, sweep in data["sweep"].items():
        assert sweep["gate_up"]["tried"] >= 1 and sweep["down"]["tried"] >= 1, tokens
        assert sweep["joint"]["layer_ms"] > 0
    phases = [row["phase"] for row in data["estimate"]]
    assert phases == ["prefill", "decode at 4 rows"]
    decode = data["estimate"][1]
    assert decode["waves"] == 128 and decode["layer_calls"] == 128 * 512 * 2  # 512 requests / 4 rows
    assert all(row["layer_s"] > 0 and row["roofline_s"] > 0 for row in data["estimate"])
    assert "| prefill |" in proc.stdout and "Not counted" in proc.stdout
