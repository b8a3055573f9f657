"""Triton's per-process start on a thread beside the model's load (kernels/warmup.py): the work it does is
the work the first launch would do (the cache key is then cached), and only CUDA runs start it."""

from __future__ import annotations

import torch

from batchgen.config import EngineConfig
from batchgen.engine.build import _triton_warmup
from batchgen.kernels import warmup


def test_the_thread_leaves_tritons_cache_key_computed():
    from triton.runtime.cache import triton_key

    triton_key.cache_clear()
    thread = warmup.start()
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert triton_key.cache_info().currsize == 1  # the first launch finds it


def test_only_a_cuda_run_with_triton_kernels_starts_it():
    assert _triton_warmup(EngineConfig(), torch.device("cpu")) is None
    torch_attention = EngineConfig(attention_backend="torch")
    assert _triton_warmup(torch_attention, torch.device("cuda")) is None
