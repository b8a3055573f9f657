"""The mixture-of-experts architectures' config.json (``qwen3_moe``, ``qwen2_moe``, ``mixtral``, ``olmoe``)
as transformers 5.24 reads them, for ``checkpoint_config.py``: their config classes' defaults
(``models/<type>/configuration_<type>.py``) and what their modelling code derives from them
(``modeling_<type>.py``): each layer's attention window, and each layer's MLP (a ``MoELayout`` with the
routing and sizes the router and experts modules take, None where the decoder layer builds a dense MLP).
"""

from __future__ import annotations

from typing import Any

from batchgen.model.files.checks import BOOL, INT, UnsupportedConfig, check_layer_types, int_list
from batchgen.model.moe_layout import MoELayout, Routing

Values = dict[str, Any]  # a config's fields, its config.json's over the class defaults

_QWEN_MOE: dict[str, Any] = {  # what Qwen3MoeConfig and Qwen2MoeConfig share
    "vocab_size": 151936, "hidden_size": 2048, "num_hidden_layers": 24, "hidden_act": "silu",
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "use_sliding_window": False, "sliding_window": 4096, "decoder_sparse_step": 1, "norm_topk_prob": False,
    "mlp_only_layers": None, "pad_token_id": None, "bos_token_id": None, "eos_token_id": None,
    "head_dim": None,  # no field: the attention takes hidden / heads unless config.json gives one
}  # fmt: skip
# The dataclass defaults of transformers 5.24's models/<type>/configuration_<type>.py (5.17's are the same).
MOE_DEFAULTS: dict[str, dict[str, Any]] = {
    "qwen3_moe": {
        **_QWEN_MOE, "intermediate_size": 6144, "num_attention_heads": 32, "num_key_value_heads": 4,
        "moe_intermediate_size": 768, "num_experts_per_tok": 8, "num_experts": 128,
    },
    "qwen2_moe": {
        **_QWEN_MOE, "intermediate_size": 5632, "num_attention_heads": 16, "num_key_value_heads": 16,
        "max_window_layers": 28, "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
        "num_experts_per_tok": 4, "num_experts": 60,
    },
    "mixtral": {
        "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": None, "hidden_act": "silu",
        "max_position_embeddings": 4096 * 32, "rms_norm_eps": 1e-5, "pad_token_id": None, "bos_token_id": 1,
        "eos_token_id": 2, "tie_word_embeddings": False, "sliding_window": None, "num_experts_per_tok": 2,
        "num_local_experts": 8,
    },
    "olmoe": {
        "vocab_size": 50304, "hidden_size": 2048, "intermediate_size": 2048, "num_hidden_layers": 16,
        "num_attention_heads": 16, "num_key_value_heads": None, "head_dim": None, "hidden_act": "silu",
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "pad_token_id": 1, "bos_token_id": None,
        "eos_token_id": 50279, "tie_word_embeddings": False, "num_experts_per_tok": 8, "num_experts": 64,
        "norm_topk_prob": False,
    },
}  # fmt: skip
MOE_KINDS = {
    **dict.fromkeys(("num_experts", "num_local_experts", "num_experts_per_tok", "decoder_sparse_step"), INT),
    **dict.fromkeys(("moe_intermediate_size", "shared_expert_intermediate_size"), INT),
    "norm_topk_prob": BOOL, "qkv_bias": BOOL, "mlp_only_layers": lambda v: v is None or int_list(v),
}  # fmt: skip
MOE_DEFAULT_THETAS = {"mixtral": 1_000_000.0}  # MixtralConfig.default_theta
# Null where the class rejects it (@strict ``int``) or the attention module trips on it.
MOE_NOT_NONE = {
    "qwen3_moe": ("num_key_value_heads", "head_dim"), "qwen2_moe": ("num_key_value_heads", "head_dim"),
    "mixtral": ("num_key_value_heads",), "olmoe": ("head_dim",),
}  # fmt: skip
# Per type: (the expert count's field, the name transformers' attribute_map writes over it). Qwen3-MoE's
# save_pretrained writes its count as num_local_experts.
_COUNT_KEYS = {
    "qwen3_moe": ("num_experts", "num_local_experts"), "mixtral": ("num_local_experts", "num_experts"),
    "olmoe": ("num_experts", "num_local_experts"), "qwen2_moe": ("num_experts", None),
}  # fmt: skip
# Checked like fields though no default of ours: the other bias flags, the count's other name.
MOE_TYPE_FIELDS = {
    "qwen3_moe": ("attention_bias", "num_local_experts"), "qwen2_moe": ("qkv_bias",),
    "mixtral": ("num_experts",), "olmoe": ("attention_bias", "num_local_experts"),
}  # fmt: skip
# Keys the modelling code reads elsewhere than batchgen's spec does, or that only another type defines:
# layer_types would make transformers' cache slide where the attention does not; OLMoE hands
# sliding_window to the attention under a causal mask; qwen2_moe reads no num_local_experts; the expert
# sizes of another type would reach config_problem through a transformers config.
MOE_REFUSED = {
    "qwen3_moe": ("layer_types", "shared_expert_intermediate_size"),
    "qwen2_moe": ("num_local_experts",),
    "mixtral": ("layer_types", "moe_intermediate_size", "shared_expert_intermediate_size"),
    "olmoe": ("layer_types", "sliding_window", "moe_intermediate_size", "shared_expert_intermediate_size"),
}
EXPERT_SIZES = ("moe_intermediate_size", "shared_expert_intermediate_size")


def moe_sliding_windows(model_type: str, values: Values, raw: Values) -> tuple[int | None, ...]:
    """Per layer: OLMoE none; Mixtral the config's window on every layer; Qwen3-MoE the window (if
    use_sliding_window) on every layer; Qwen2-MoE the window (if use_sliding_window) on the layers
    ``layer_types`` marks sliding, by default the even ones below max_window_layers."""
    layers = values["num_hidden_layers"]
    if model_type == "olmoe":
        return (None,) * layers
    window = values["sliding_window"] if values.get("use_sliding_window", True) else None  # Mixtral: no flag
    if window is not None and window < 1:
        raise UnsupportedConfig(f"sliding_window {window}")
    if model_type != "qwen2_moe":
        return (window,) * layers
    if window is None and values["use_sliding_window"]:  # Qwen2MoeModel builds a sliding mask: it raises
        raise UnsupportedConfig("use_sliding_window without a sliding window")
    types = raw.get("layer_types")
    if types is None:
        types = _qwen2_moe_layer_types(values["max_window_layers"], values["use_sliding_window"], layers)
    types = check_layer_types(types, window, layers)
    return tuple(window if t == "sliding_attention" else None for t in types)


def _qwen2_moe_layer_types(max_window_layers: int, use_sliding_window: bool, layers: int) -> list[str]:
    """``Qwen2MoeConfig.__post_init__``: unlike Qwen2's, the even layers below max_window_layers slide."""
    sliding = [(i + 1) % 2 == 1 and i < max_window_layers and use_sliding_window for i in range(layers)]
    return ["sliding_attention" if s else "full_attention" for s in sliding]


def check_olmoe_heads(hidden: int, heads: int, head_dim: int) -> None:
    """OLMoE's q norm spans hidden_size and its k norm (hidden / heads) * kv_heads: the projections match
    them only when head_dim is hidden / heads exactly."""
    if hidden % heads or head_dim != hidden // heads:
        raise UnsupportedConfig(f"OLMoE with hidden size {hidden}, {heads} heads, head_dim {head_dim}")


def expert_sizes(values: Values) -> dict[str, int | None]:
    """The experts' and the shared expert's intermediate sizes, for the types whose config has them."""
    sizes = {name: values.get(name) for name in EXPERT_SIZES}
    if any(size is not None and size < 1 for size in sizes.values()):
        raise UnsupportedConfig(f"expert sizes {sizes}")
    return sizes


def moe_layouts(model_type: str, values: Values, raw: Values) -> tuple[MoELayout | None, ...]:
    """Per decoder layer, its sparse MLP as transformers builds it; None where the layer's MLP is dense."""
    sizes = expert_sizes(values)
    experts = sizes["moe_intermediate_size"] or values["intermediate_size"]  # Mixtral, OLMoE: the latter
    layout = MoELayout(_routing(model_type, values, raw), experts, sizes["shared_expert_intermediate_size"])
    return tuple(layout if sparse else None for sparse in _sparse_layers(model_type, values))


def _routing(model_type: str, values: Values, raw: Values) -> Routing:
    """The TopKRouter's settings; Mixtral's router renormalises whatever the config says."""
    experts, top_k = _expert_count(model_type, values, raw), values["num_experts_per_tok"]
    if not 1 <= top_k <= experts:  # torch.topk raises, or (no expert) the config means something else
        raise UnsupportedConfig(f"top {top_k} of {experts} experts")
    renormalize = values.get("norm_topk_prob", True)
    return Routing(experts, top_k, renormalize, fp32_weights=model_type == "mixtral")


def _expert_count(model_type: str, values: Values, raw: Values) -> int:
    """The count's field, unless config.json names it the other way: transformers' attribute_map then
    writes that value over the field's."""
    field, alias = _COUNT_KEYS[model_type]
    if field in raw and alias in raw and raw[field] != raw[alias]:
        raise UnsupportedConfig(f"{field} {raw[field]} and {alias} {raw[alias]}")
    return values[alias] if alias in raw else values[field]


def _sparse_layers(model_type: str, values: Values) -> list[bool]:
    """Which decoder layers are MoE: all of Mixtral's and OLMoE's; Qwen's every decoder_sparse_step-th
    but those mlp_only_layers lists (``Qwen*MoeDecoderLayer.__init__``)."""
    layers = values["num_hidden_layers"]
    if model_type in ("mixtral", "olmoe"):
        return [True] * layers
    step, dense = values["decoder_sparse_step"], values["mlp_only_layers"] or []
    if step < 1:  # 0 divides by zero; a negative step counts from the other side
        raise UnsupportedConfig(f"decoder_sparse_step {step}")
    return [i not in dense and (i + 1) % step == 0 for i in range(layers)]
