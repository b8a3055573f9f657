"""A checkpoint's ``config.json`` read without transformers, as transformers 5.24 reads it: the config
classes' defaults and derivations (``models/*/configuration_*.py``), RoPE standardization
(``modeling_rope_utils.py``), and what the attention and rotary modules derive (``model_spec``: the
``ModelSpec`` that ``describe`` reads off a meta skeleton). Dense architectures here, the
mixture-of-experts ones in ``moe_config.py`` (with each layer's ``MoELayout``). Wherever transformers
could read a config differently it refuses (``read_config`` returns None) and the caller loads it through
transformers."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

import torch

from batchgen.model.files import moe_config as moe
from batchgen.model.files.checks import BOOL, INT, NUMBER, OPT_INT, UnsupportedConfig, check_layer_types, of
from batchgen.model.moe_layout import MoELayout
from batchgen.model.spec import DENSE_MODEL_TYPES, MOE_MODEL_TYPES, ModelSpec

TYPES = DENSE_MODEL_TYPES + MOE_MODEL_TYPES
DEFAULT_THETA = 10_000.0  # RotaryEmbeddingConfigMixin.default_theta
# The RoPE kinds read here, with what each needs besides rope_theta (transformers' _validate_*_parameters).
_ROPE_NEEDS: dict[str, tuple[str, ...]] = {
    "default": (),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}
ROPE_TYPES = tuple(_ROPE_NEEDS)
_ACTIVATIONS = ("silu", "swish")
_ROPE_KEYS = frozenset(
    ("rope_type", "type", "rope_theta", "factor", "low_freq_factor", "high_freq_factor")
    + ("original_max_position_embeddings", "partial_rotary_factor")
)
# Keys that, set to anything but None, make transformers build or run another model: remote code, a nested
# text config (``get_text_config`` returns it), per-layer overrides, clamped q/k/v, chunked masks, module
# fusions at load, another weights file.
_REFUSED_KEYS = (
    "auto_map", "text_config", "decoder", "generator", "text_encoder", "per_layer_config", "clip_qkv",
    "attention_chunk_size", "fusion_config", "transformers_weights",
)  # fmt: skip
# Per type: keys the modelling code would read although batchgen's spec ignores them (Llama's cache and
# generation masks follow ``sliding_window``; Mistral only warns about ``layer_types``), and expert sizes,
# which a dense model's transformers config would hand config_problem.
_EXPERT_SIZES = moe.EXPERT_SIZES
_REFUSED_PER_TYPE = {
    "llama": ("sliding_window", "layer_types", *_EXPERT_SIZES), "mistral": ("layer_types", *_EXPERT_SIZES),
    "qwen2": _EXPERT_SIZES, "qwen3": _EXPERT_SIZES, **moe.MOE_REFUSED,
}  # fmt: skip

_COMMON_DEFAULTS: dict[str, Any] = {
    "hidden_act": "silu", "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "pad_token_id": None,
    "head_dim": None,
}  # fmt: skip
_QWEN_DEFAULTS: dict[str, Any] = {
    "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 32, "max_position_embeddings": 32768,
    "bos_token_id": None, "eos_token_id": None, "use_sliding_window": False, "sliding_window": 4096,
    "max_window_layers": 28,
}  # fmt: skip
# The dataclass defaults of transformers 5.24's models/<type>/configuration_<type>.py.
DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {
        **_COMMON_DEFAULTS, "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": None,
        "max_position_embeddings": 2048, "bos_token_id": 1, "eos_token_id": 2,
    },
    "mistral": {
        **_COMMON_DEFAULTS, "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "max_position_embeddings": 4096 * 32, "bos_token_id": 1, "eos_token_id": 2, "sliding_window": 4096,
    },
    "qwen2": {**_COMMON_DEFAULTS, **_QWEN_DEFAULTS},  # no head_dim field: hidden / heads unless given
    "qwen3": {**_COMMON_DEFAULTS, **_QWEN_DEFAULTS, "head_dim": 128},
    **moe.MOE_DEFAULTS,
}  # fmt: skip
_KINDS = {
    **dict.fromkeys(("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers"), INT),
    **dict.fromkeys(("num_attention_heads", "max_position_embeddings", "max_window_layers"), INT),
    **dict.fromkeys(("num_key_value_heads", "head_dim", "pad_token_id", "bos_token_id"), OPT_INT),
    **dict.fromkeys(("tie_word_embeddings", "use_sliding_window", "attention_bias", "mlp_bias"), BOOL),
    "sliding_window": OPT_INT, "rms_norm_eps": of(float), "hidden_act": of(str),
    "eos_token_id": lambda v: OPT_INT(v) or (type(v) is list and all(map(INT, v))), **moe.MOE_KINDS,
}  # fmt: skip
# Fields whose None the config class rejects (or, for Qwen2's head_dim, the attention module trips on).
_SIZES = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
    "max_position_embeddings",
)  # fmt: skip
_NOT_NONE = {
    "mistral": ("num_key_value_heads",), "qwen2": ("head_dim",), "qwen3": ("head_dim",), **moe.MOE_NOT_NONE,
}  # fmt: skip
_TYPE_FIELDS = {"llama": ("attention_bias", "mlp_bias"), "qwen3": ("attention_bias",), **moe.MOE_TYPE_FIELDS}


@dataclass(frozen=True)
class FileConfig:
    """What batchgen reads of a checkpoint config; attribute names follow transformers' configs."""

    model_type: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    hidden_act: str
    bos_token_id: int | None
    eos_token_id: int | list[int] | None
    pad_token_id: int | None
    quantization_config: dict | None
    sliding_windows: tuple[int | None, ...]  # per layer, as the attention modules have them
    rope_parameters: dict[str, Any]  # standardized as transformers' config.rope_parameters
    moe_layouts: tuple[MoELayout | None, ...]  # per layer: its sparse MLP, None for a dense one
    raw: dict[str, Any]  # the parsed config.json
    # The configs that have them (Qwen's MoE types): config_problem reads them as on transformers' configs.
    moe_intermediate_size: int | None = None
    shared_expert_intermediate_size: int | None = None

    def get_text_config(self, decoder: bool | None = None, encoder: bool | None = None) -> FileConfig:
        return self  # a flat config is its own text config, as in transformers


def read_config(path: str) -> FileConfig | None:
    """``path/config.json`` read as transformers would read it; None when it cannot be sure to."""
    try:
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            raw = json.load(f)
    except (OSError, ValueError):  # absent or not JSON: transformers reports it
        return None
    try:
        return parse_config(raw)
    except UnsupportedConfig:
        return None


def parse_config(raw: Any) -> FileConfig:
    """The parsed config.json -> FileConfig; raises UnsupportedConfig saying why it cannot."""
    values = _typed_values(raw)
    model_type = raw["model_type"]
    sizes = _sizes(model_type, values)
    return FileConfig(
        model_type=model_type, **sizes, rms_norm_eps=values["rms_norm_eps"],
        tie_word_embeddings=values["tie_word_embeddings"], hidden_act=values["hidden_act"],
        bos_token_id=values["bos_token_id"], eos_token_id=values["eos_token_id"],
        pad_token_id=_pad_id(values["pad_token_id"], sizes["vocab_size"]),
        quantization_config=_quantization(raw), sliding_windows=_sliding_windows(model_type, values, raw),
        rope_parameters=_rope_parameters(raw, sizes["max_position_embeddings"], model_type), raw=raw,
        **_mlps(model_type, values, raw),
    )  # fmt: skip


def _typed_values(raw: Any) -> dict[str, Any]:
    """The config's fields over the type's defaults, each of the type transformers' @strict accepts."""
    model_type = _model_type(raw)
    defaults = DEFAULTS[model_type]
    names = (*defaults, *_TYPE_FIELDS.get(model_type, ()))
    for name in names:
        if name in raw and not _KINDS[name](raw[name]):
            raise UnsupportedConfig(f"{name} = {raw[name]!r}: of a type transformers rejects")
    for name in _NOT_NONE.get(model_type, ()):
        if name in raw and raw[name] is None:
            raise UnsupportedConfig(f"{name} is null")
    values = {**defaults, **{k: raw[k] for k in names if k in raw}}
    if values["hidden_act"] not in _ACTIVATIONS:
        raise UnsupportedConfig(f"activation {values['hidden_act']!r}")
    return values


def _model_type(raw: Any) -> str:
    """The model type, once nothing in the config makes transformers build or run another model."""
    model_type = raw.get("model_type") if isinstance(raw, dict) else None
    if model_type not in TYPES:
        raise UnsupportedConfig(f"model type {model_type!r}")
    for key in _REFUSED_KEYS + _REFUSED_PER_TYPE.get(model_type, ()):
        if raw.get(key) is not None:
            raise UnsupportedConfig(f"{key} is set")
    _check_flags(raw)
    return model_type


def _check_flags(raw: dict[str, Any]) -> None:
    """Bidirectional attention, and a dtype transformers' config cannot resolve (it raises)."""
    if raw.get("is_causal", True) is not True:
        raise UnsupportedConfig("is_causal is not true (bidirectional masks)")
    for key in ("dtype", "torch_dtype"):
        value = raw.get(key)
        if value is not None and not (
            type(value) is str and isinstance(getattr(torch, value, None), torch.dtype)
        ):
            raise UnsupportedConfig(f"{key} = {value!r}")


def _sizes(model_type: str, values: dict[str, Any]) -> dict[str, int]:
    """Sizes with the config classes' derivations (``__post_init__``) and the attention's head_dim."""
    hidden, heads = values["hidden_size"], values["num_attention_heads"]
    sizes = {name: values[name] for name in _SIZES}
    if any(v < 1 for v in sizes.values()):
        raise UnsupportedConfig(f"a size below 1: {sizes}")
    kv = values["num_key_value_heads"]
    sizes["num_key_value_heads"] = heads if kv is None else kv
    sizes["head_dim"] = hidden // heads if values["head_dim"] is None else values["head_dim"]
    if sizes["num_key_value_heads"] < 1 or heads % sizes["num_key_value_heads"] or sizes["head_dim"] < 1:
        raise UnsupportedConfig(f"{heads} heads, {kv} key/value heads, head_dim {sizes['head_dim']}")
    if model_type == "llama" and hidden % heads:  # LlamaConfig.validate_architecture raises
        raise UnsupportedConfig(f"hidden size {hidden} not a multiple of {heads} heads")
    if model_type == "olmoe":
        moe.check_olmoe_heads(hidden, heads, sizes["head_dim"])
    return sizes


def _mlps(model_type: str, values: dict[str, Any], raw: dict[str, Any]) -> dict[str, Any]:
    """Each layer's MLP (a MoELayout, None for a dense one) and the expert sizes a MoE config has."""
    if model_type not in MOE_MODEL_TYPES:
        return {"moe_layouts": (None,) * values["num_hidden_layers"]}
    return {"moe_layouts": moe.moe_layouts(model_type, values, raw), **moe.expert_sizes(values)}


def _pad_id(pad: int | None, vocab: int) -> int | None:
    if pad is not None and not -vocab <= pad < vocab:  # nn.Embedding's padding_idx asserts
        raise UnsupportedConfig(f"pad_token_id {pad} outside the vocabulary")
    return pad


def _quantization(raw: dict[str, Any]) -> dict | None:
    qc = raw.get("quantization_config")
    if qc is not None and not isinstance(qc, dict):
        raise UnsupportedConfig(f"quantization_config = {qc!r}")
    return qc


def _sliding_windows(model_type: str, values: dict[str, Any], raw: dict[str, Any]) -> tuple[int | None, ...]:
    """Per layer: Llama none; Mistral the config's window on every layer; Qwen2/Qwen3 the window (if
    use_sliding_window) on the layers ``layer_types`` marks sliding; the MoE types per ``moe_config``."""
    layers = values["num_hidden_layers"]
    if model_type in MOE_MODEL_TYPES:
        return moe.moe_sliding_windows(model_type, values, raw)
    if model_type == "llama":
        return (None,) * layers
    window = values["sliding_window"]
    if window is not None and window < 1:
        raise UnsupportedConfig(f"sliding_window {window}")
    if model_type == "mistral":
        return (window,) * layers
    window = window if values["use_sliding_window"] else None
    types = _layer_types(raw.get("layer_types"), window, values["max_window_layers"], layers)
    return tuple(window if t == "sliding_attention" else None for t in types)


def _layer_types(types: Any, window: int | None, max_window_layers: int, layers: int) -> list[str]:
    if types is None:  # Qwen2Config.__post_init__
        sliding = window is not None
        return [
            "sliding_attention" if sliding and i >= max_window_layers else "full_attention"
            for i in range(layers)
        ]
    return check_layer_types(types, window, layers)


def _rope_parameters(raw: dict[str, Any], max_positions: int, model_type: str) -> dict[str, Any]:
    """``convert_rope_params_to_dict`` + ``standardize_rope_params``: either layout -> one flat dict."""
    scaling, params = raw.get("rope_scaling"), raw.get("rope_parameters")
    if scaling and params:  # transformers keeps rope_scaling and drops rope_parameters, theta included
        raise UnsupportedConfig("both rope_scaling and rope_parameters")
    rope = scaling or params or {}
    if not isinstance(rope, dict) or not set(rope) <= _ROPE_KEYS:  # per-layer-type dicts, yarn's keys...
        raise UnsupportedConfig(f"rope parameters {rope!r}")
    rope = dict(rope)
    rope.setdefault(
        "rope_theta", raw.get("rope_theta", moe.MOE_DEFAULT_THETAS.get(model_type, DEFAULT_THETA))
    )
    if raw.get("partial_rotary_factor") is not None:
        rope.setdefault("partial_rotary_factor", raw["partial_rotary_factor"])
    rope.setdefault("rope_type", rope.get("type", "default"))
    if rope["rope_type"] == "llama3":
        if "original_max_position_embeddings" in raw:  # the rotary module re-standardizes with it
            raise UnsupportedConfig("original_max_position_embeddings outside the rope parameters")
        rope.setdefault("original_max_position_embeddings", max_positions)
    _check_rope(rope)
    return rope


def _check_rope(rope: dict[str, Any]) -> None:
    if rope["rope_type"] not in ROPE_TYPES:
        raise UnsupportedConfig(f"rope type {rope['rope_type']!r}")
    partial = rope.get("partial_rotary_factor", 1.0)
    if not NUMBER(partial) or partial != 1:
        raise UnsupportedConfig(f"partial_rotary_factor {partial!r}")
    for key in ("rope_theta", *_ROPE_NEEDS[rope["rope_type"]]):
        if not NUMBER(rope.get(key)):
            raise UnsupportedConfig(f"rope {key} = {rope.get(key)!r}")


def inv_freq(cfg: FileConfig) -> torch.Tensor:
    """The rotary module's inv_freq [head_dim / 2], fp32 on the CPU, with transformers' ops in its order
    (the model's ``compute_default_rope_parameters``, ``_compute_{linear_scaling,llama3}_..._parameters``)."""
    rope, dim = cfg.rope_parameters, cfg.head_dim
    base = rope["rope_theta"]
    if rope["rope_type"] == "default":
        return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float, device="cpu") / dim))
    freqs = 1.0 / (
        base ** (torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").to(dtype=torch.float) / dim)
    )
    if rope["rope_type"] == "linear":
        freqs /= rope["factor"]
        return freqs
    return _llama3(freqs, rope)


def _llama3(inv_freq: torch.Tensor, rope: dict[str, Any]) -> torch.Tensor:
    """``_compute_llama3_parameters`` after the base frequencies, op for op."""
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old_context_len = rope["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = old_context_len / low, old_context_len / high
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low) / (high - low)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


def model_spec(cfg: FileConfig) -> ModelSpec:
    """What ``describe`` reads off this model's meta skeleton, from the config alone."""
    return ModelSpec(
        model_type=cfg.model_type, num_layers=cfg.num_hidden_layers, hidden=cfg.hidden_size,
        q_heads=cfg.num_attention_heads, kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
        vocab=cfg.vocab_size, intermediate=cfg.intermediate_size, eps=cfg.rms_norm_eps,
        scale=cfg.head_dim**-0.5, sliding_windows=cfg.sliding_windows,
        tied_embeddings=cfg.tie_word_embeddings, **_qk_norms(cfg), inv_freq=inv_freq(cfg),
        rope_scaling=1.0,  # attention_scaling of default, linear and llama3 RoPE
    )  # fmt: skip


def _qk_norms(cfg: FileConfig) -> dict[str, bool]:
    """Qwen3 and Qwen3-MoE norm q and k per head; OLMoE over the whole projections, which ``describe``
    (comparing the q norm's width with head_dim) reads as per head when there is one head."""
    if cfg.model_type == "olmoe":
        full = cfg.hidden_size != cfg.head_dim
        return {"qk_norm": not full, "qk_norm_full": full}
    return {"qk_norm": cfg.model_type in ("qwen3", "qwen3_moe"), "qk_norm_full": False}
