"""Programmatic dependent launch (kernels/pdl.py): only on CUDA, and it changes no bit of a forward."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from batchgen.kernels.pdl import DECODE_ROWS, enabled, pdl_options


def test_no_dependent_launch_off_the_gpu():
    """The interpreter (CPU tensors) compiles the kernels with PDL=False and gets no launch keyword."""
    assert pdl_options(torch.zeros(1)) == {}
    assert pdl_options(torch.zeros(DECODE_ROWS + 1, 8)) == {}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_decode_sized_launches_go_without_pdl():
    """Decode steps (at most ``DECODE_ROWS`` rows) ran faster without PDL on the H200; prompt steps keep it
    where the device has it."""
    assert pdl_options(torch.zeros(DECODE_ROWS, 8, device="cuda")) == {}
    want = {"PDL": True, "launch_pdl": True} if enabled(torch.cuda.current_device()) else {}
    assert pdl_options(torch.zeros(DECODE_ROWS + 1, 8, device="cuda")) == want


def _fp8_forward_logits(path: str, intermediate: int = 3072) -> None:
    """A small Qwen3-shaped FP8 model (weights and cache) on the GPU kernels: prompt chunks, then decode
    steps (RMSNorm, rotary write, decode attention and its merge, FP8 products with split-K sums, SiLU),
    the logits saved to ``path``. Run in a fresh process: PDL is decided once per process."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from batchgen.config import EngineConfig
    from batchgen.distributed.group import ParallelGroup
    from batchgen.kernels.fp8_reference import FP8
    from batchgen.model.backends import TritonBackend
    from batchgen.model.build import ModelFiles, build_model
    from batchgen.model.kv_cache import KVShape
    from batchgen.testing.paged import sequence_logits

    config = AutoConfig.for_model(
        "qwen3", vocab_size=4096, hidden_size=1024, intermediate_size=intermediate, num_hidden_layers=4,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval().cuda()
    ids = torch.randint(0, 4096, (700,), device="cuda")
    options = EngineConfig(device="cuda", quantization="fp8", kv_cache_dtype="fp8")
    bundle = build_model(options, ModelFiles(None, model.config, model), ParallelGroup.single(),
                         torch.device("cuda"), torch.bfloat16, 4096)  # fmt: skip
    with torch.inference_mode():
        logits = sequence_logits(bundle.forward, ids, [512, 160] + [1] * 28, KVShape(4, 8, 128), FP8,
                                 TritonBackend())  # fmt: skip
    torch.save(logits.cpu(), path)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_dependent_launch_changes_no_bit(tmp_path):
    """Kernels launched early wait for their producer before touching memory: the same logits, bit for bit,
    as with BATCHGEN_PDL=0 (every kernel here is deterministic)."""
    logits = {}
    for pdl in ("1", "0"):
        path = str(tmp_path / f"logits_{pdl}.pt")
        code = f"from tests.kernels.test_pdl import _fp8_forward_logits; _fp8_forward_logits({path!r})"
        env = {**os.environ, "BATCHGEN_PDL": pdl}
        subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=240)
        logits[pdl] = torch.load(path)
    assert logits["1"].isfinite().all() and torch.equal(logits["1"], logits["0"])
