"""Triton's per-process start on a thread beside the model's load (kernels/warmup.py): the work it does is
the work the first launch would do (the cache key is then cached), and only CUDA runs start it."""

from __future__ import annotations

import torch

from batchgen.config import EngineConfig
from batchgen.engine.rank_engine import _triton_warmup
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


def test_an_fp8_cache_compiles_the_cuda_attention_on_the_thread(monkeypatch):
    from batchgen.kernels.attention import fp8_decode_cuda

    asked = []
    monkeypatch.setattr(fp8_decode_cuda, "prepare", lambda *args: asked.append(args))
    warmup.start((3, True)).join(timeout=120)
    warmup.start(None).join(timeout=120)
    assert asked == [(3, True)]  # only when asked for, with the device and the query's dtype


def test_the_engine_asks_for_it_with_an_fp8_cache_only(monkeypatch):
    started = []
    monkeypatch.setattr(warmup, "start", lambda fp8=None: started.append(fp8))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    cuda = torch.device("cuda", 1)
    _triton_warmup(EngineConfig(kv_cache_dtype="fp8"), cuda, torch.bfloat16)
    _triton_warmup(EngineConfig(kv_cache_dtype="fp8"), torch.device("cuda"), torch.float16)
    _triton_warmup(EngineConfig(), cuda, torch.bfloat16)
    _triton_warmup(EngineConfig(kv_cache_dtype="fp8"), cuda, torch.float32)
    assert started == [(1, True), (0, False), None, None]


def test_a_failed_compile_on_the_thread_is_forgotten(monkeypatch, caplog):
    """The thread's compile is best effort: if it fails (here: no CUDA at all), nothing is cached, so
    the first step compiles again instead of running Triton's kernel for the whole run."""
    from batchgen.kernels.attention import fp8_decode_cuda
    from batchgen.kernels.launch import tma

    monkeypatch.setattr(fp8_decode_cuda, "_enabled", lambda: True)
    monkeypatch.setattr(fp8_decode_cuda, "_has_fp8_converts", lambda index: True)
    monkeypatch.setattr(tma, "supported", lambda index: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda index=None: None)
    fp8_decode_cuda._kernel.cache_clear()
    fp8_decode_cuda.prepare(0, True)
    assert "did not compile" in caplog.text
    assert fp8_decode_cuda._kernel.cache_info().currsize == 0
