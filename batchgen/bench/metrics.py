"""Measurements around a run: device bandwidth, peak memory, engine-stat deltas, the decode roofline."""

from __future__ import annotations

import math
import resource
import time
from dataclasses import fields, is_dataclass
from typing import Any

import torch

# Engine counters that a run adds to (the CUDA runner adds the timing ones; absent ones read as None).
STAT_FIELDS = (
    "steps",
    "output_tokens",
    "prompt_tokens",
    "schedule_s",
    "postprocess_s",
    "mask_s",
    "gpu_busy_s",
    "wall_s",
)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_bandwidth(device: torch.device, nbytes: int | None = None, reps: int = 5) -> float:
    """Bytes per second a large copy moves (read + write), the ceiling a decode step can reach."""
    nbytes = nbytes or ((1 << 30) if device.type == "cuda" else (64 << 20))
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    dst.copy_(src)  # first touch: page faults and allocator work are not bandwidth
    sync(device)
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        dst.copy_(src)
        sync(device)
        best = min(best, time.perf_counter() - t0)
    del src, dst
    return 2 * nbytes / best


def _rss_hwm_bytes() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def reset_peak_memory(device: torch.device) -> None:
    """Start a fresh peak. On Linux, writing 5 to clear_refs resets the RSS high-water mark."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass  # the peak then covers the whole process so far: still an upper bound


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    hwm = _rss_hwm_bytes()
    return hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def snapshot(stats: Any) -> dict[str, float | None]:
    """The additive engine counters now (an LLM's stats accumulate over warm-up and timed runs)."""
    names = {f.name for f in fields(stats)} if is_dataclass(stats) else set(STAT_FIELDS)
    return {n: (getattr(stats, n, None) if n in names else None) for n in STAT_FIELDS}


def delta(before: dict, after: dict) -> dict[str, float | None]:
    """What one run added. Stats that were reset in between (fewer steps than before) are taken whole."""
    if (after.get("steps") or 0) < (before.get("steps") or 0):
        return dict(after)
    return {
        n: (after[n] - before[n]) if after.get(n) is not None and before.get(n) is not None else after.get(n)
        for n in STAT_FIELDS
    }


def model_bytes(
    model: torch.nn.Module, quantization: str | None = None, kv_cache_dtype: str = "auto"
) -> dict[str, int]:
    """Weight bytes a decode step reads, and KV bytes one cached token takes.

    The input embedding is a row lookup, not a full read: it counts only when it is the (tied) LM head.
    With ``quantization="fp8"`` the decoder layers' projections and routed experts count one byte a weight
    plus one fp32 scale per output row; ``kv_cache_dtype="fp8"``: one byte a cached element.
    """
    params = {id(p): p for p in model.parameters()}  # tied weights appear once
    total = sum(p.numel() * p.element_size() for p in params.values())
    if quantization == "fp8":
        for name, w in model.named_parameters():
            # the projections ("..._proj.weight") and the routed experts' stacks ("experts.gate_up_proj")
            if name.startswith("model.layers.") and (name.endswith("_proj.weight") or ".experts." in name):
                rows = w.numel() // w.shape[-1]  # one fp32 scale per output row (per expert)
                total -= w.numel() * (w.element_size() - 1) - 4 * rows
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    if head is None or head.weight is not emb:
        total -= emb.numel() * emb.element_size()
    cfg = model.config.get_text_config()
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    elem = 1 if kv_cache_dtype == "fp8" else next(model.parameters()).element_size()
    kv_per_token = 2 * cfg.num_hidden_layers * kv_heads * head_dim * elem
    return {"weights": total, "kv_per_token": kv_per_token}


def decode_ideal_s(
    sizes: dict[str, int], requests: int, prompt_len: int, new_tokens: int, concurrency: int, bandwidth: float
) -> float:
    """Seconds the decode would take if every step only moved its bytes at full bandwidth.

    Steps: one per new token per wave of ``concurrency`` requests, each reading all weights once.
    KV: every new token reads its sequence's context (prompt + tokens so far), i.e. the mean context
    ``prompt + (new - 1) / 2`` on average. Prefill compute is left out: this is the decode roofline.
    """
    waves = math.ceil(requests / max(1, concurrency))
    weight_bytes = waves * new_tokens * sizes["weights"]
    kv_bytes = requests * new_tokens * (prompt_len + (new_tokens - 1) / 2) * sizes["kv_per_token"]
    return (weight_bytes + kv_bytes) / bandwidth
