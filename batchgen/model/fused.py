"""batchgen's own forward pass for the Llama family (Llama, Mistral, Qwen2, Qwen3), on the model's weights.

transformers' modelling code launches ~50 kernels per decoder layer (norms, rotary, activations, the
q/k/v and gate/up projections one by one): at small batches their launch and memory cost exceed the
attention and matmuls themselves. This forward runs ~10 per layer: RMSNorm fused with the residual add,
one q|k|v and one gate|up projection, the q/k norm + rotary + KV write in one kernel, SiLU-and-multiply.
The merged projection weights are built once and the model's own ``nn.Linear`` weights become views of
them, so memory does not grow and transformers' forward keeps working on the same model. The old
weight tensors are freed then: CUDA graphs captured earlier on the same model by transformers' forward
(another engine with ``model_impl="transformers"``) must not be replayed afterwards.
Architectures or options it does not cover make ``unsupported_reason`` say why: the engine then runs
transformers' forward instead.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from batchgen.model.attention import PagedContext

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
# Rotary kinds whose frequencies do not change with the sequence length ("dynamic" ones do).
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


class LayerWeights(NamedTuple):
    input_norm: torch.Tensor  # [H]
    qkv: torch.Tensor  # [(Hq + 2 * Hkv) * D, H]
    qkv_bias: torch.Tensor | None
    q_norm: torch.Tensor | None  # [D] (Qwen3)
    k_norm: torch.Tensor | None
    o_proj: torch.Tensor  # [H, Hq * D]
    o_bias: torch.Tensor | None
    post_norm: torch.Tensor  # [H]
    gate_up: torch.Tensor  # [2 * I, H]
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor  # [H, I]
    down_bias: torch.Tensor | None
    sliding_window: int | None


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """Why this forward cannot run ``model`` (None when it can)."""
    cfg = model.config
    model_type = getattr(cfg, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return f"model type {model_type!r} (supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
    if getattr(cfg, "hidden_act", None) not in ("silu", "swish"):
        return f"activation {cfg.hidden_act!r}"
    rotary = model.model.rotary_emb
    if getattr(rotary, "rope_type", "default") not in STATIC_ROPE_TYPES:
        return f"rope type {rotary.rope_type!r}"
    attn = model.model.layers[0].self_attn
    if rotary.inv_freq.numel() * 2 != attn.head_dim:
        return "partial rotary embedding"
    if getattr(cfg, "quantization_config", None) is not None or any(
        not p.dtype.is_floating_point or p.dtype.itemsize < 2 for p in model.parameters()
    ):
        return "quantized weights"
    if getattr(model, "hf_device_map", None) or any(p.device.type == "meta" for p in model.parameters()):
        return "weights spread over devices or offloaded (device_map)"
    for layer in model.model.layers:
        groups = [(layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj)]
        groups.append((layer.mlp.gate_proj, layer.mlp.up_proj))
        if any(len({lin.bias is None for lin in group}) > 1 for group in groups):
            return "projections with and without bias in one group"
    return None


def _merged(linears: list[torch.nn.Linear], name: str) -> torch.Tensor | None:
    """One tensor whose row blocks are the layers' ``name`` tensors, which become views of it.

    Already merged (a second engine on the same model): the row blocks sit back to back in one storage,
    and the view over all of them is returned without copying."""
    parts = [getattr(lin, name) for lin in linears]
    if parts[0] is None:
        return None
    rows = sum(p.shape[0] for p in parts)
    if _adjacent(parts):
        return parts[0].as_strided((rows, *parts[0].shape[1:]), parts[0].stride(), parts[0].storage_offset())
    with torch.inference_mode(False):  # normal tensors: the model stays usable outside inference mode
        merged = torch.cat([p.detach() for p in parts])
        for lin, view in zip(linears, merged.split([p.shape[0] for p in parts]), strict=True):
            getattr(lin, name).data = view
    return merged


def _adjacent(parts: list[torch.Tensor]) -> bool:
    first = parts[0]
    offset = first.storage_offset()
    for p in parts:
        same = p.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
        if not (same and p.is_contiguous() and p.storage_offset() == offset):
            return False
        offset += p.numel()
    return True


def _sliding_window(model: torch.nn.Module, attn: torch.nn.Module) -> int | None:
    if hasattr(attn, "sliding_window"):  # Qwen2/Qwen3 decide per layer
        return attn.sliding_window
    return getattr(model.config, "sliding_window", None) if model.config.model_type == "mistral" else None


def _layer_weights(model: torch.nn.Module, layer: torch.nn.Module) -> LayerWeights:
    attn, mlp = layer.self_attn, layer.mlp
    qkv = [attn.q_proj, attn.k_proj, attn.v_proj]
    q_norm = getattr(attn, "q_norm", None)
    k_norm = getattr(attn, "k_norm", None)
    return LayerWeights(
        layer.input_layernorm.weight, _merged(qkv, "weight"), _merged(qkv, "bias"),
        q_norm.weight if q_norm is not None else None, k_norm.weight if k_norm is not None else None,
        attn.o_proj.weight, attn.o_proj.bias, layer.post_attention_layernorm.weight,
        _merged([mlp.gate_proj, mlp.up_proj], "weight"), _merged([mlp.gate_proj, mlp.up_proj], "bias"),
        mlp.down_proj.weight, mlp.down_proj.bias, _sliding_window(model, attn),
    )  # fmt: skip


def rope_tables(rotary: torch.nn.Module, max_positions: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """cos, sin [max_positions, D / 2] in the model dtype, computed as transformers computes them."""
    inv_freq = rotary.inv_freq.float()
    positions = torch.arange(max_positions, device=inv_freq.device, dtype=torch.float32)
    freqs = positions[:, None] * inv_freq[None, :]  # [P, D / 2], fp32 like transformers
    scaling = getattr(rotary, "attention_scaling", 1.0)
    return (freqs.cos() * scaling).to(dtype).contiguous(), (freqs.sin() * scaling).to(dtype).contiguous()


class FusedForward:
    """``forward(input_ids [T], positions [T], logits_indices [S], ctx) -> logits [S, V]``."""

    def __init__(self, model: torch.nn.Module, max_positions: int) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"batchgen's forward does not support this model: {reason}")
        base = model.model
        attn = base.layers[0].self_attn
        self.q_heads = model.config.num_attention_heads
        self.kv_heads = getattr(model.config, "num_key_value_heads", None) or self.q_heads
        self.scale = attn.scaling
        self.eps = base.norm.variance_epsilon
        self.embed = base.embed_tokens.weight
        self.final_norm = base.norm.weight
        self.lm_head, self.lm_head_bias = model.lm_head.weight, model.lm_head.bias
        with torch.no_grad():
            layers = base.layers[: model.config.num_hidden_layers]
            self.layers = [_layer_weights(model, layer) for layer in layers]
            self.cos, self.sin = rope_tables(base.rotary_emb, max_positions, self.embed.dtype)

    def __call__(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        logits_indices: torch.Tensor,  # [S]
        ctx: PagedContext,
    ) -> torch.Tensor:  # [S, V]
        ops = ctx.backend
        x = F.embedding(input_ids, self.embed)  # [T, H]
        residual = None
        for i, w in enumerate(self.layers):
            x, residual = self._layer(i, w, x, residual, positions, ctx)
        hidden, _ = ops.rms_norm(x, self.final_norm, self.eps, residual)
        return F.linear(hidden[logits_indices], self.lm_head, self.lm_head_bias)

    def _layer(self, i: int, w: LayerWeights, x, residual, positions, ctx: PagedContext):
        ops = ctx.backend
        tokens = x.shape[0]
        h, residual = ops.rms_norm(x, w.input_norm, self.eps, residual)
        qkv = F.linear(h, w.qkv, w.qkv_bias)  # [T, (Hq + 2 * Hkv) * D]
        k_cache, v_cache = ctx.kv_caches[i]
        q = ops.rope_write_kv(
            qkv, positions, self.cos, self.sin, w.q_norm, w.k_norm, self.eps,
            k_cache, v_cache, ctx.slot_mapping, self.q_heads, self.kv_heads,
        )  # fmt: skip
        attn = ops.attention(q, k_cache, v_cache, ctx, self.scale, w.sliding_window)  # [T, Hq, D]
        out = F.linear(attn.reshape(tokens, -1), w.o_proj, w.o_bias)
        h, residual = ops.rms_norm(out, w.post_norm, self.eps, residual)
        act = ops.silu_mul(F.linear(h, w.gate_up, w.gate_up_bias))  # [T, I]
        return F.linear(act, w.down, w.down_bias), residual
