"""Kernel backends: the device-specific ops a forward pass calls, behind one interface.

``TorchBackend`` is the CPU path (torch ops); ``TritonBackend`` runs the Triton kernels on CUDA,
capturable in CUDA graphs (every bound comes from the context's Python ints, never from tensor
contents). Both expose paged attention with its KV write, and the fused layer ops of the batchgen
forward (``model/fused.py``): RMSNorm with residual add, q/k norm + rotary + KV write, SiLU-and-multiply.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

from batchgen.kernels import cpu_attention, reference

if TYPE_CHECKING:
    from batchgen.model.attention import PagedContext
    from batchgen.threads import ThreadGovernor


class KernelBackend(Protocol):
    def write_kv(self, k_cache, v_cache, key, value, slot_mapping) -> None: ...

    def attention(
        self, query, k_cache, v_cache, ctx: PagedContext, scale: float, sliding_window
    ) -> torch.Tensor: ...

    def rms_norm(self, x, weight, eps: float, residual=None) -> tuple[torch.Tensor, torch.Tensor]: ...

    def rope_write_kv(
        self, qkv, positions, cos, sin, q_norm, k_norm, eps, k_cache, v_cache, slot_mapping, q_heads, kv_heads
    ) -> torch.Tensor: ...

    def silu_mul(self, x) -> torch.Tensor: ...


class TorchBackend:
    """The CPU path: the torch reference ops, with attention whose cost follows each sequence's own
    context (``kernels/cpu_attention.py``, tested against ``reference.paged_attention``). A ``governor``
    adjusts torch's CPU threads to the machine's load; it looks from here, the thread the model runs on."""

    def __init__(self, governor: ThreadGovernor | None = None) -> None:
        self.governor = governor

    write_kv = staticmethod(reference.write_kv)
    rms_norm = staticmethod(reference.rms_norm)
    rope_write_kv = staticmethod(reference.rope_write_kv)
    silu_mul = staticmethod(reference.silu_mul)

    def attention(self, query, k_cache, v_cache, ctx: PagedContext, scale: float, sliding_window):
        if self.governor is not None:
            self.governor.tick()
        return cpu_attention.paged_attention(
            query, k_cache, v_cache, ctx.cu_seqlens_q, ctx.seq_lens, ctx.block_tables, scale, sliding_window
        )


class TritonBackend:
    """The CUDA path: Triton kernels, capturable in CUDA graphs (bounds come from the context)."""

    def __init__(self) -> None:
        from batchgen.kernels import activation, dispatch, norm, rope

        self._kernels = dispatch
        self.write_kv = dispatch.write_kv
        self.rms_norm = norm.rms_norm
        self.rope_write_kv = rope.rope_write_kv
        self.silu_mul = activation.silu_mul

    def attention(self, query, k_cache, v_cache, ctx: PagedContext, scale: float, sliding_window):
        return self._kernels.paged_attention_triton(
            query, k_cache, v_cache, ctx.cu_seqlens_q, ctx.seq_lens, ctx.block_tables, scale, sliding_window,
            decode_only=ctx.max_q_len == 1, max_seq_len=ctx.max_seq_len, max_q_len=ctx.max_q_len,
        )  # fmt: skip
