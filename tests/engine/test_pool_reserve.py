"""The KV pool leaves room for what a step takes beside its activations: a weight-only FP8 model widens its
largest projection for prompt steps (``kernels/gemm/dequant.py``), so its pool is that much smaller."""

from __future__ import annotations

import torch

from batchgen import LLM
from batchgen.config import EngineConfig
from batchgen.engine import rank_engine
from batchgen.model import kv_cache


def test_weight_only_fp8_reserves_its_largest_widened_projection(tiny_llama):
    options = dict(device="cpu", load_format="random", extra={"progress": False})
    plain = LLM(tiny_llama, **options)
    fp8 = LLM(tiny_llama, quantization="fp8", **options)
    attn, mlp = fp8._rank.bundle.forward.layers[0].attn, fp8._rank.bundle.forward.layers[0].mlp
    largest = max(p.weight.numel() for p in (attn.qkv, attn.o_proj, mlp.gate_up, mlp.down))
    assert fp8._rank.bundle.workspace_bytes == largest * 4  # fp32 on the CPU
    assert plain._rank.bundle.workspace_bytes == 0


def test_the_cuda_pool_budget_takes_the_workspace_off(monkeypatch):
    reserves = []

    def budget(device, utilization, reserve_bytes):
        reserves.append(reserve_bytes)
        return 1 << 30

    monkeypatch.setattr(kv_cache, "cuda_budget", budget)
    shape = kv_cache.KVShape(2, 2, 16)
    args = (EngineConfig(max_num_seqs=8), shape, torch.device("cuda"), torch.float16, 256, 1000)
    rank_engine._num_blocks(*args)
    rank_engine._num_blocks(*args, workspace_bytes=3 << 20)
    assert reserves == [rank_engine.ACTIVATION_RESERVE, rank_engine.ACTIVATION_RESERVE + (3 << 20)]
