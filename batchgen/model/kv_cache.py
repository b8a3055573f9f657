"""The paged KV pool: one (key, value) tensor pair per layer, sized from a memory budget.

``--kv-cache-dtype fp8`` stores e4m3 (one byte an element): the same budget holds twice the tokens of a
16-bit cache (four times fp32's).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

_CPU_DEFAULT_BUDGET = 1 << 30  # 1 GiB: plenty for CPU batches, and allocated only up to what is needed


class KVShape(NamedTuple):
    num_layers: int
    num_kv_heads: int
    head_dim: int

    def bytes_per_block(self, block_size: int, dtype: torch.dtype) -> int:
        elem = torch.empty((), dtype=dtype).element_size()
        return 2 * self.num_layers * block_size * self.num_kv_heads * self.head_dim * elem


def cache_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """``EngineConfig.kv_cache_dtype`` -> the pool's element type."""
    return torch.float8_e4m3fn if kv_cache_dtype == "fp8" else model_dtype


def kv_shape(config) -> KVShape:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return KVShape(text.num_hidden_layers, kv_heads, head_dim)


def cuda_budget(device: torch.device, utilization: float, reserve_bytes: int) -> int:
    """Bytes for the pool: ``utilization`` of the device, minus what is in use and an activation reserve."""
    free, total = torch.cuda.mem_get_info(device)
    return int(total * utilization) - (total - free) - reserve_bytes


def num_blocks_for(
    shape: KVShape,
    block_size: int,
    dtype: torch.dtype,
    budget_bytes: int,
    max_useful_tokens: int,
) -> int:
    per_block = shape.bytes_per_block(block_size, dtype)
    useful = -(-max_useful_tokens // block_size)
    blocks = min(budget_bytes // per_block, useful)
    if blocks < 1:
        raise ValueError(
            f"the KV cache budget ({budget_bytes / 2**20:.0f} MiB) holds no block of {per_block} bytes: "
            "raise --gpu-memory-utilization or lower --max-batch-tokens"
        )
    return int(blocks)


def default_cpu_budget() -> int:
    return _CPU_DEFAULT_BUDGET


def allocate(
    shape: KVShape, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    dims = (num_blocks, block_size, shape.num_kv_heads, shape.head_dim)
    # Zero-filled: kernels mask unwritten slots, but NaN garbage must never reach a matmul.
    zeros = _lazy_zeros if device.type == "cpu" else torch.zeros
    return [
        (zeros(dims, dtype=dtype, device=device), zeros(dims, dtype=dtype, device=device))
        for _ in range(shape.num_layers)
    ]


def _lazy_zeros(dims: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Zeros whose pages the OS maps on first write (numpy's calloc): torch.zeros writes the whole pool
    at start-up (seconds for the CPU's default pool) and holds it in RSS from then on,
    while a CPU run touches only the blocks its sequences use."""
    nbytes = math.prod(dims) * torch.empty((), dtype=dtype).element_size()
    return torch.from_numpy(np.zeros(nbytes, np.uint8)).view(dtype).view(dims)
