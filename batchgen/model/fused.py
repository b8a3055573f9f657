"""batchgen's own forward pass for the Llama family (Llama, Mistral, Qwen2, Qwen3) and its mixture-of-experts
relatives (Qwen2/3-MoE, Mixtral, OLMoE: their MLP is ``model/moe_layer.py``'s), sharded or not.

transformers' modelling code launches ~50 kernels per decoder layer (norms, rotary, activations, the
q/k/v and gate/up projections one by one): at small batches their launch and memory cost exceed the
attention and matmuls themselves. This forward runs ~10 per layer: RMSNorm fused with the residual add,
one q|k|v and one gate|up projection, the q/k norm + rotary + KV write in one kernel, SiLU-and-multiply.
Projections are ``Linear`` objects of a weight format (``model/weights``); under tensor parallelism
q|k|v and gate|up hold the rank's rows and o_proj / down are ``RowParallel`` (one all-reduce each), the
embedding and LM head hold the rank's vocabulary range. ``model/assemble.py`` builds it.

FP8 (``model/weights/fp8.py``) needs no branch here: a projection's ``act_quant`` is handed to the op that
produces its input (RMSNorm, SiLU-and-multiply), which then writes it quantized; an FP8 KV cache is
written and read by the attention ops with the layer's ``kv_scales``. q|k|v, o_proj and down_proj are
called with ``summed=False``: a split-K FP8 product then reaches rotary or the next RMSNorm as its
partials (``kernels/gemm/split_sums.py``), which that op adds, instead of through a summing launch.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch

from batchgen.distributed.group import ParallelGroup
from batchgen.distributed.layers import LMHead, VocabEmbedding
from batchgen.kernels.fp8_format import ActQuant, Fp8Act
from batchgen.kernels.gemm.split_sums import SplitSums
from batchgen.model.backends import KernelBackend, PagedContext
from batchgen.model.weights.formats import Linear


class MLP(Protocol):  # [T, H] -> [T, H], perhaps as split-K partials (the next RMSNorm adds them)
    def __call__(self, h: torch.Tensor | Fp8Act, ops: KernelBackend) -> torch.Tensor | SplitSums: ...


class DenseMLP:
    """gate|up (column-parallel) -> SiLU-and-multiply -> down (row-parallel). A gate|up projection with a
    ``silu_mul`` method (FP8 rowwise) may apply SiLU in its product's kernel; it returns None where not."""

    def __init__(self, gate_up: Linear, down: Linear) -> None:
        self.gate_up, self.down = gate_up, down
        self._product_silu = getattr(gate_up, "silu_mul", None)

    def __call__(self, h: torch.Tensor | Fp8Act, ops: KernelBackend) -> torch.Tensor | SplitSums:
        quant = self.down.act_quant
        act = self._product_silu(h, quant) if self._product_silu is not None else None  # [T, I]
        if act is None:
            act = ops.silu_mul(self.gate_up(h), quant)  # [T, 2I] -> [T, I]
        return self.down(act, summed=False)  # -> [T, H]: the next RMSNorm adds split-K partials


class ProjectionNorm:
    """OLMoE's q and k RMSNorms over the whole projection width (not per head), applied in place to the
    q|k|v projection before rotary. Under tensor parallelism a rank holds some of the heads, so the mean
    of squares spans ranks: the [T, 1] partial sums are all-reduced (a KV head replicated on ``kv_copies``
    ranks is counted once)."""

    def __init__(
        self, q_weight: torch.Tensor, k_weight: torch.Tensor, widths: tuple[int, int], eps: float,
        group: ParallelGroup, kv_copies: int = 1,
    ) -> None:  # fmt: skip
        self.q_weight, self.k_weight = q_weight, k_weight  # [Hq * D / K], [Hkv * D / K]: this rank's part
        self.widths, self.eps, self.group, self.kv_copies = widths, eps, group, kv_copies

    def __call__(self, qkv: torch.Tensor, ops: KernelBackend) -> None:  # qkv: [T, (Hq + 2 * Hkv) * D]
        q_width, k_width = self.q_weight.shape[0], self.k_weight.shape[0]
        q, k = qkv[:, :q_width], qkv[:, q_width : q_width + k_width]
        if not self.group.is_parallel:
            q.copy_(ops.rms_norm(q, self.q_weight, self.eps)[0])
            k.copy_(ops.rms_norm(k, self.k_weight, self.eps)[0])
            return
        self._sharded(q, self.q_weight, self.widths[0], 1)
        self._sharded(k, self.k_weight, self.widths[1], self.kv_copies)

    def _sharded(self, x: torch.Tensor, weight: torch.Tensor, width: int, copies: int) -> None:
        h = x.float()
        partial = h.pow(2).sum(-1, keepdim=True)  # [T, 1]
        if copies > 1:
            partial /= copies
        variance = self.group.all_reduce(partial) / width
        x.copy_(weight * (h * torch.rsqrt(variance + self.eps)).to(x.dtype))


class Attention(NamedTuple):
    qkv: Linear  # [T, H] -> [T, (Hq + 2 * Hkv) * D], this rank's heads
    q_norm: torch.Tensor | None  # [D] (Qwen3)
    k_norm: torch.Tensor | None
    o_proj: Linear  # [T, Hq * D] -> [T, H]
    sliding_window: int | None
    full_norm: ProjectionNorm | None = None  # OLMoE
    kv_scales: tuple[float, float] = (1.0, 1.0)  # an FP8 cache stores k / k_scale, v / v_scale


class Layer(NamedTuple):
    input_norm: torch.Tensor  # [H]
    attn: Attention
    post_norm: torch.Tensor  # [H]
    mlp: MLP
    mlp_quant: ActQuant | None = None  # how the MLP wants its input (the post-attention norm's output)


class FusedForward:
    """``forward(input_ids [T], positions [T], logits_indices [S], ctx) -> logits [S, V / K]`` (the
    rank's vocabulary range; all of it in one process)."""

    def __init__(
        self, layers: list[Layer], embed: VocabEmbedding, final_norm: torch.Tensor, lm_head: LMHead,
        rope: tuple[torch.Tensor, torch.Tensor], heads: tuple[int, int], scale: float, eps: float,
    ) -> None:  # fmt: skip
        self.layers, self.embed, self.final_norm, self.lm_head = layers, embed, final_norm, lm_head
        self.cos, self.sin = rope  # [max_positions, D / 2]
        self.q_heads, self.kv_heads = heads  # this rank's
        self.scale, self.eps = scale, eps

    def __call__(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        logits_indices: torch.Tensor,  # [S]
        ctx: PagedContext,
    ) -> torch.Tensor:  # [S, V / K]
        ops = ctx.backend
        x = self.embed(input_ids)  # [T, H]
        residual = None
        for i, layer in enumerate(self.layers):
            x, residual = self.layer_step(i, layer, x, residual, positions, ctx)
        hidden, _ = ops.rms_norm(x, self.final_norm, self.eps, residual)
        return self.lm_head(hidden[logits_indices])

    def layer_step(
        self, i: int, layer: Layer, x: torch.Tensor | SplitSums, residual: torch.Tensor | None,
        positions: torch.Tensor, ctx: PagedContext,
    ) -> tuple[torch.Tensor | SplitSums, torch.Tensor]:  # fmt: skip
        """Decoder layer ``i`` (``layer``: this model's, or a stand-in for it while it calibrates): its input
        and the residual stream before it -> its output and the residual stream after its attention."""
        ops = ctx.backend
        h, residual = ops.rms_norm(x, layer.input_norm, self.eps, residual, layer.attn.qkv.act_quant)
        h = self._attention(i, layer.attn, h, positions, ctx)
        h, residual = ops.rms_norm(h, layer.post_norm, self.eps, residual, layer.mlp_quant)
        return layer.mlp(h, ops), residual

    def _attention(self, i: int, w: Attention, h, positions, ctx: PagedContext) -> torch.Tensor | SplitSums:
        ops = ctx.backend
        qkv = w.qkv(h, summed=w.full_norm is not None)  # [T, (Hq + 2 * Hkv) * D]; rotary adds partials
        if w.full_norm is not None:
            w.full_norm(qkv, ops)
        k_cache, v_cache = ctx.kv_caches[i]
        q = ops.rope_write_kv(
            qkv, positions, self.cos, self.sin, w.q_norm, w.k_norm, self.eps,
            k_cache, v_cache, ctx.slot_mapping, self.q_heads, self.kv_heads, w.kv_scales,
        )  # fmt: skip
        attn = ops.attention(
            q, k_cache, v_cache, ctx, self.scale, w.sliding_window, w.kv_scales
        )  # [T, Hq, D]
        return w.o_proj(attn.reshape(qkv.shape[0], -1), summed=False)  # the next RMSNorm adds partials
