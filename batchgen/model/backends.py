"""Kernel backends: the device-specific ops a forward pass calls, behind one interface.

``TorchBackend`` is the CPU path (torch ops); ``TritonBackend`` runs the Triton kernels on CUDA,
capturable in CUDA graphs (every bound comes from the context's Python ints, never from tensor
contents). Both expose paged attention with its KV write, and the fused layer ops of the batchgen
forward (``model/fused.py``): RMSNorm with residual add, q/k norm + rotary + KV write, SiLU-and-multiply,
and the routed experts of a mixture-of-experts layer (``model/moe_layer.py``).
``PagedContext`` is what a backend reads of one step: the KV pool, the step's paged-cache metadata, and
the backend itself, which transformers' attention hook (``model/attention.py``) finds there.

FP8: ``quant`` asks RMSNorm / SiLU-and-multiply for an e4m3 output (``Fp8Act``); an FP8 KV cache (its
dtype says so) is written as ``k / k_scale`` and read back as ``q * k_scale`` with the layer's
``kv_scales`` (ignored for 16/32-bit caches).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Protocol

import torch

from batchgen.kernels import fp8_format, reference
from batchgen.kernels.cpu import cpu_attention, cpu_rotary
from batchgen.kernels.fp8_format import ActQuant, Fp8Act
from batchgen.kernels.gemm.split_sums import SplitSums, summed
from batchgen.kernels.moe.expert_format import Fp8Experts, dequantize, quantize_activations

if TYPE_CHECKING:
    from batchgen.threads import ThreadGovernor


class PagedContext(NamedTuple):
    """Everything one forward pass needs to read and write the paged KV cache (device tensors)."""

    kv_caches: list[tuple[torch.Tensor, torch.Tensor]]  # per layer: [num_blocks, block_size, kv_heads, hd]
    slot_mapping: torch.Tensor  # [T] int64, -1 = padding
    cu_seqlens_q: torch.Tensor  # [B + 1] int32
    seq_lens: torch.Tensor  # [B] int32
    block_tables: torch.Tensor  # [B, max_blocks] int32
    max_q_len: int  # host-side bounds, fixed per CUDA-graph bucket
    max_seq_len: int
    backend: KernelBackend
    # An eager step with prompts: its first ``decode_rows`` sequences have one query row each and run
    # the decode kernel; the prompts' chunks run the varlen kernel on cu_seqlens_q from their first row.
    decode_rows: int = 0
    prompt_cu_seqlens_q: torch.Tensor | None = None  # [B - decode_rows + 1] int32, from 0


class KernelBackend(Protocol):
    def write_kv(self, k_cache, v_cache, key, value, slot_mapping) -> None: ...

    def attention(
        self, query, k_cache, v_cache, ctx: PagedContext, scale: float, sliding_window,
        kv_scales: tuple[float, float] = (1.0, 1.0),
    ) -> torch.Tensor: ...  # fmt: skip

    # ``x`` / ``qkv`` may be a product's split-K partials (``SplitSums``): the op adds them
    def rms_norm(
        self, x: torch.Tensor | SplitSums, weight, eps: float, residual=None, quant: ActQuant | None = None
    ) -> tuple[torch.Tensor | Fp8Act, torch.Tensor]: ...

    def rope_write_kv(
        self, qkv: torch.Tensor | SplitSums, positions, cos, sin, q_norm, k_norm, eps, k_cache, v_cache,
        slot_mapping, q_heads, kv_heads, kv_scales: tuple[float, float] = (1.0, 1.0),
    ) -> torch.Tensor: ...  # fmt: skip

    def silu_mul(self, x, quant: ActQuant | None = None) -> torch.Tensor | Fp8Act: ...

    # gate_up [E, 2I, H], down [E, H, I]: 16/32-bit stacks or ``Fp8Experts``
    def moe_experts(self, h, weights, ids, gate_up, down) -> torch.Tensor: ...  # [T, H]


def _rounded_inputs(experts: Fp8Experts):
    """What an ``act_fp8`` product's input becomes on the CPU: rounded to e4m3 under its dynamic scales."""
    return lambda x: quantize_activations(x, experts).to(x.dtype)


class TorchBackend:
    """The CPU path: the torch reference ops, with attention whose cost follows each sequence's own
    context (``kernels/cpu/cpu_attention.py``, tested against ``reference.paged_attention``). A ``governor``
    adjusts torch's CPU threads to the machine's load; it looks from here, the thread the model runs on."""

    def __init__(self, governor: ThreadGovernor | None = None) -> None:
        self.governor = governor
        self._plans_of: PagedContext | None = None  # the step whose attention plans are cached
        self._plans: dict[tuple[int | None, int], cpu_attention.StepPlan] = {}  # by (window, block size)
        self._rotary_of: tuple = (None, None, None)  # the step (positions, slots, cos) of _rotary
        self._rotary: cpu_rotary.RotaryPlan | None = None

    write_kv = staticmethod(reference.write_kv)

    @staticmethod
    def moe_experts(h, weights, ids, gate_up, down) -> torch.Tensor:
        """FP8 experts (``Fp8Experts``) dequantized to the model dtype, only those the step routes to,
        then the 16-bit grouped math of the reference; with ``act_fp8`` each product's input rounded to
        e4m3 under its dynamic scales first."""
        inputs = None
        if isinstance(gate_up, Fp8Experts) and gate_up.act_fp8:
            inputs = tuple(_rounded_inputs(w) for w in (gate_up, down))
        if isinstance(gate_up, Fp8Experts) or isinstance(down, Fp8Experts):
            used = torch.unique(ids)
            gate_up, down = (
                dequantize(w, h.dtype, used) if isinstance(w, Fp8Experts) else w for w in (gate_up, down)
            )
        return reference.moe_experts(h, weights, ids, gate_up, down, inputs)

    def rms_norm(self, x, weight, eps: float, residual=None, quant: ActQuant | None = None):
        out, total = reference.rms_norm(summed(x), weight, eps, residual)
        return (out if quant is None else fp8_format.quantize_act(out, quant)), total

    def rope_write_kv(
        self, qkv, positions, cos, sin, q_norm, k_norm, eps, k_cache, v_cache, slot_mapping, q_heads,
        kv_heads, kv_scales=(1.0, 1.0),
    ):  # fmt: skip
        qkv = summed(qkv)
        if q_norm is not None or fp8_format.is_fp8(k_cache):  # Qwen3's q/k norms, FP8 caches: the oracle
            return reference.rope_write_kv(
                qkv, positions, cos, sin, q_norm, k_norm, eps, k_cache, v_cache, slot_mapping, q_heads,
                kv_heads, kv_scales,
            )  # fmt: skip
        step = (positions, slot_mapping, cos)
        if any(a is not b for a, b in zip(self._rotary_of, step, strict=True)):
            self._rotary_of, self._rotary = step, cpu_rotary.plan_rotary(positions, cos, sin, slot_mapping)
        return cpu_rotary.rope_write_kv(qkv, self._rotary, k_cache, v_cache, q_heads, kv_heads)

    def silu_mul(self, x, quant: ActQuant | None = None):
        out = reference.silu_mul(x)
        return out if quant is None else fp8_format.quantize_act(out, quant)

    def attention(
        self, query, k_cache, v_cache, ctx: PagedContext, scale: float, sliding_window, kv_scales=(1.0, 1.0)
    ):
        if self.governor is not None:
            self.governor.tick()
        if fp8_format.is_fp8(k_cache):  # the oracle's FP8 path: rare on the CPU
            return reference.paged_attention_fp8(
                query, k_cache, v_cache, ctx.cu_seqlens_q, ctx.seq_lens, ctx.block_tables, scale,
                sliding_window, kv_scales,
            )  # fmt: skip
        plan = self._step_plan(ctx, k_cache, sliding_window)
        return cpu_attention.attend(query, k_cache, v_cache, plan, scale, sliding_window)

    def _step_plan(self, ctx: PagedContext, k_cache, sliding_window) -> cpu_attention.StepPlan:
        """Made at a step's first layer and reused by the others (per sliding window): every layer reads the
        same blocks. A new step comes with a new context. No layer but the first plans the blocks."""
        if self._plans_of is not ctx:
            self._plans_of, self._plans = ctx, {}
        block_size = k_cache.shape[1]
        key = (sliding_window, block_size)
        if key not in self._plans:
            self._plans[key] = cpu_attention.plan_step(
                ctx.cu_seqlens_q, ctx.seq_lens, ctx.block_tables, block_size, sliding_window
            )
        return self._plans[key]


class TritonBackend:
    """The CUDA path: Triton kernels, capturable in CUDA graphs (bounds come from the context)."""

    def __init__(self) -> None:
        from batchgen.kernels.attention import dispatch
        from batchgen.kernels.layer_ops import activation, norm, rope
        from batchgen.kernels.moe import routed_experts as moe

        self._kernels = dispatch
        self.write_kv = dispatch.write_kv
        self.rms_norm = norm.rms_norm
        self.rope_write_kv = rope.rope_write_kv
        self.silu_mul = activation.silu_mul
        self.moe_experts = moe.moe_experts

    def attention(
        self, query, k_cache, v_cache, ctx: PagedContext, scale: float, sliding_window, kv_scales=(1.0, 1.0)
    ):
        return self._kernels.paged_attention_triton(
            query, k_cache, v_cache, ctx.cu_seqlens_q, ctx.seq_lens, ctx.block_tables, scale, sliding_window,
            decode_only=ctx.max_q_len == 1, max_seq_len=ctx.max_seq_len, max_q_len=ctx.max_q_len,
            kv_scales=kv_scales, decode_rows=ctx.decode_rows, prompt_cu_seqlens_q=ctx.prompt_cu_seqlens_q,
        )  # fmt: skip
