"""What batchgen's own forward needs to know about an architecture, read off transformers' modules.

The modules may live on the meta device (a skeleton built without memory): only their structure and
constants are read here, never their weights. ``unsupported_reason`` says why the fused forward cannot
run a model; the engine then runs transformers' modelling code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from batchgen.model.moe_layout import MoELayout, layout_of

DENSE_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
MOE_MODEL_TYPES = ("qwen3_moe", "qwen2_moe", "mixtral", "olmoe")  # the MoE layer: model/moe_layer.py
# Attention windows read off the config, not the attention module.
_CONFIG_WINDOW_TYPES = ("mistral", "mixtral", "olmoe")
# Rotary kinds whose frequencies do not change with the sequence length ("dynamic" ones do).
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True)
class ModelSpec:
    model_type: str
    num_layers: int
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    intermediate: int
    eps: float
    scale: float  # attention softmax scale
    sliding_windows: tuple[int | None, ...]  # per layer
    tied_embeddings: bool
    qk_norm: bool  # per-head RMSNorm of q and k (Qwen3)
    qk_norm_full: bool  # RMSNorm over the whole q and k projections (OLMoE)
    inv_freq: torch.Tensor  # [head_dim / 2] float32, on the CPU
    rope_scaling: float  # transformers' attention_scaling of cos / sin


class ModelStructure(NamedTuple):
    """What ``assemble`` builds from: the spec, the config, and each decoder layer's MLP: its
    ``MoELayout``, None for a dense one. Read off transformers' modules (``skeleton_structure``) or
    off the config file alone (``model/files/checkpoint_config.py``)."""

    spec: ModelSpec
    config: Any  # a transformers config, or a FileConfig
    layers: Sequence[MoELayout | None]


def skeleton_structure(model: torch.nn.Module) -> ModelStructure:
    """The structure of a model whose config only transformers reads: read off its modules."""
    spec = describe(model)
    layers = [layout_of(spec.model_type, layer) for layer in model.model.layers[: spec.num_layers]]
    return ModelStructure(spec, model.config, layers)


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """Why the fused forward cannot run ``model`` (a real or meta-device module); None when it can."""
    cfg = model.config
    model_type = getattr(cfg, "model_type", None)
    if model_type not in DENSE_MODEL_TYPES + MOE_MODEL_TYPES:
        supported = ", ".join(DENSE_MODEL_TYPES + MOE_MODEL_TYPES)
        return f"model type {model_type!r} (supported: {supported})"
    if getattr(cfg, "clip_qkv", None) is not None:
        return f"clip_qkv ({cfg.clip_qkv}: q/k/v clamped after the projections)"
    if getattr(cfg, "hidden_act", None) not in ("silu", "swish"):
        return f"activation {cfg.hidden_act!r}"
    rotary = model.model.rotary_emb
    if getattr(rotary, "rope_type", "default") not in STATIC_ROPE_TYPES:
        return f"rope type {rotary.rope_type!r}"
    attn = model.model.layers[0].self_attn
    if rotary.inv_freq.numel() * 2 != attn.head_dim:
        return "partial rotary embedding"
    reason = _in_memory_reason(model)
    if reason is not None:
        return reason
    for layer in model.model.layers:
        a = layer.self_attn
        if len({lin.bias is None for lin in (a.q_proj, a.k_proj, a.v_proj)}) > 1:
            return "projections with and without bias in one group"
        mlp = layer.mlp
        if hasattr(mlp, "gate_proj") and (mlp.gate_proj.bias is None) != (mlp.up_proj.bias is None):
            return "projections with and without bias in one group"
    return None


def _in_memory_reason(model: torch.nn.Module) -> str | None:
    """What only a model built in memory can show (a meta skeleton holds no weights): weights that
    transformers quantized itself, or spread over devices."""
    devices = {p.device.type for p in model.parameters()}
    if devices == {"meta"}:
        return None
    if getattr(model.config, "quantization_config", None) is not None or any(
        not p.dtype.is_floating_point or p.dtype.itemsize < 2 for p in model.parameters()
    ):
        return "quantized weights"
    if getattr(model, "hf_device_map", None) or "meta" in devices:
        return "weights spread over devices or offloaded (device_map)"
    return None


def _sliding_window(model: torch.nn.Module, attn: torch.nn.Module) -> int | None:
    if hasattr(attn, "sliding_window"):  # Qwen2/Qwen3 (and their MoE) decide per layer
        return attn.sliding_window
    if model.config.model_type in _CONFIG_WINDOW_TYPES:
        return getattr(model.config, "sliding_window", None)
    return None


def rotary_frequencies(model: torch.nn.Module) -> tuple[torch.Tensor, float]:
    """inv_freq [D / 2] (fp32, CPU) and the attention scaling, as transformers computes them. A meta
    skeleton's buffers hold no values: the rotary module is rebuilt on the CPU from the config."""
    rotary = model.model.rotary_emb
    if rotary.inv_freq.device.type == "meta":
        rotary = type(rotary)(config=model.config)
    return rotary.inv_freq.detach().float().cpu(), float(getattr(rotary, "attention_scaling", 1.0))


def describe(model: torch.nn.Module) -> ModelSpec:
    reason = unsupported_reason(model)
    if reason is not None:
        raise ValueError(f"batchgen's forward does not support this model: {reason}")
    cfg, base = model.config, model.model
    layers = base.layers[: cfg.num_hidden_layers]
    attn = layers[0].self_attn
    q_heads = cfg.num_attention_heads
    inv_freq, rope_scaling = rotary_frequencies(model)
    q_norm = getattr(attn, "q_norm", None)
    full_norm = q_norm is not None and q_norm.weight.shape[0] != attn.head_dim  # OLMoE: [Hq * D]
    return ModelSpec(
        model_type=cfg.model_type, num_layers=cfg.num_hidden_layers, hidden=cfg.hidden_size,
        q_heads=q_heads, kv_heads=getattr(cfg, "num_key_value_heads", None) or q_heads,
        head_dim=attn.head_dim, vocab=cfg.vocab_size, intermediate=getattr(cfg, "intermediate_size", 0),
        eps=base.norm.variance_epsilon, scale=attn.scaling,
        sliding_windows=tuple(_sliding_window(model, layer.self_attn) for layer in layers),
        tied_embeddings=bool(getattr(cfg.get_text_config(), "tie_word_embeddings", False)),
        qk_norm=q_norm is not None and not full_norm, qk_norm_full=full_norm, inv_freq=inv_freq,
        rope_scaling=rope_scaling,
    )  # fmt: skip


def rope_tables(spec: ModelSpec, max_positions: int, dtype: torch.dtype, device) -> tuple[torch.Tensor, ...]:
    """cos, sin [max_positions, D / 2] in the model dtype, computed as transformers computes them."""
    inv_freq = spec.inv_freq.to(device)
    positions = torch.arange(max_positions, device=device, dtype=torch.float32)
    freqs = positions[:, None] * inv_freq[None, :]  # [P, D / 2], fp32 like transformers
    scaling = spec.rope_scaling
    return (freqs.cos() * scaling).to(dtype).contiguous(), (freqs.sin() * scaling).to(dtype).contiguous()
