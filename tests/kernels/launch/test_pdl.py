"""Programmatic dependent launch (kernels/launch/pdl.py): only on CUDA, and it changes no bit of a forward."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from batchgen.kernels.launch.pdl import DECODE_ROWS, enabled, pdl_options


def test_no_dependent_launch_off_the_gpu():
    """The interpreter (CPU tensors) compiles the kernels with PDL=False and gets no launch keyword."""
    assert pdl_options(torch.zeros(1)) == {}
    assert pdl_options(torch.zeros(DECODE_ROWS + 1, 8)) == {}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_decode_sized_launches_go_without_pdl():
    """Decode steps (at most ``DECODE_ROWS`` rows) ran faster without PDL; prompt steps keep it where the
    device has it."""
    assert pdl_options(torch.zeros(DECODE_ROWS, 8, device="cuda")) == {}
    want = {"PDL": True, "launch_pdl": True} if enabled(torch.cuda.current_device()) else {}
    assert pdl_options(torch.zeros(DECODE_ROWS + 1, 8, device="cuda")) == want


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_dependent_launch_changes_no_bit(tmp_path):
    """Kernels launched early wait for their producer before touching memory: the same logits, bit for bit,
    as with BATCHGEN_PDL=0 (every kernel here is deterministic)."""
    logits = {}
    for pdl in ("1", "0"):
        path = str(tmp_path / f"logits_{pdl}.pt")
        code = f"from tests.kernels.fp8_forward import fp8_forward_logits; fp8_forward_logits({path!r})"
        env = {**os.environ, "BATCHGEN_PDL": pdl}
        subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=240)
        logits[pdl] = torch.load(path)
    assert logits["1"].isfinite().all() and torch.equal(logits["1"], logits["0"])
