"""Configs ``model/files/checkpoint_config.py`` refuses (``UnsupportedConfig``; ``read_config`` -> None, so
the checkpoint is read through transformers instead): remote code, nested or per-layer configs, options the
fused forward does not implement, values transformers' strict validation rejects, unreadable files."""

from __future__ import annotations

import pytest

from batchgen.model.files.checkpoint_config import read_config
from tests.model.config_cases import LLAMA31, MINIMAL, SMALL, assert_refused

_LLAMA = {"model_type": "llama", **SMALL}
_QWEN2 = {"model_type": "qwen2", **{**SMALL, "num_hidden_layers": 2}}
_REFUSED = {
    "remote-code": ({**_LLAMA, "auto_map": {"AutoConfig": "x.Config"}}, "auto_map"),
    "text-config": ({**_LLAMA, "text_config": {"hidden_size": 8}}, "text_config"),
    "decoder": ({**_LLAMA, "decoder": {"hidden_size": 8}}, "decoder"),
    "per-layer": ({**_LLAMA, "per_layer_config": {"0": {"intermediate_size": 8}}}, "per_layer_config"),
    "clip-qkv": ({**_LLAMA, "clip_qkv": 8.0}, "clip_qkv"),
    "bidirectional": ({**_LLAMA, "is_causal": False}, "is_causal"),
    "chunked": ({**_LLAMA, "attention_chunk_size": 64}, "attention_chunk_size"),
    "gelu": ({**_LLAMA, "hidden_act": "gelu"}, "activation"),
    "partial-rotary": ({**_LLAMA, "partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    "partial-rotary-new": (
        {
            **_LLAMA,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5},
        },
        "partial_rotary_factor",
    ),
    "yarn": (
        {
            **_LLAMA,
            "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512},
        },
        "rope",
    ),
    "dynamic": ({**_LLAMA, "rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope type"),
    "longrope": ({**_LLAMA, "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 8}}, "rope"),
    "linear-no-factor": ({**_LLAMA, "rope_scaling": {"type": "linear"}}, "factor"),
    "null-theta": ({**_LLAMA, "rope_theta": None}, "rope_theta"),
    "both-rope-layouts": (
        {**_LLAMA, "rope_scaling": {"type": "linear", "factor": 2.0}, "rope_parameters": {"rope_theta": 5e5}},
        "both",
    ),
    "rope-per-layer-type": (
        {**_QWEN2, "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 5.0}}},
        "rope parameters",
    ),
    "llama3-outer-original-length": (
        {**_LLAMA, "rope_theta": 5e5, "rope_scaling": LLAMA31, "original_max_position_embeddings": 4096},
        "original_max_position_embeddings",
    ),
    "llama-window": ({**_LLAMA, "sliding_window": 4096}, "sliding_window"),
    "llama-layer-types": ({**_LLAMA, "layer_types": ["full_attention"] * 3}, "layer_types"),
    "mistral-layer-types": (
        {**_LLAMA, "model_type": "mistral", "layer_types": ["full_attention"] * 3},
        "layer_types",
    ),
    "layer-types-length": ({**_QWEN2, "layer_types": ["full_attention"]}, "layer_types"),
    "layer-types-legacy": ({**_QWEN2, "layer_types": ["attention"] * 2}, "layer_types"),
    "layer-types-chunked": ({**_QWEN2, "layer_types": ["chunked_attention"] * 2}, "layer_types"),
    "sliding-layer-no-window": (
        {**_QWEN2, "layer_types": ["sliding_attention"] * 2},
        "without a sliding window",
    ),
    "zero-window": ({**_LLAMA, "model_type": "mistral", "sliding_window": 0}, "sliding_window"),
    "kv-heads-not-dividing": ({**_LLAMA, "num_key_value_heads": 3}, "key/value heads"),
    "qwen-default-kv-heads": (
        {"model_type": "qwen2", **MINIMAL, "num_attention_heads": 8},
        "key/value heads",
    ),
    "llama-hidden-not-multiple": (
        {**_LLAMA, "num_attention_heads": 3, "num_key_value_heads": 1, "head_dim": 16},
        "multiple",
    ),
    "zero-size": ({**_LLAMA, "intermediate_size": 0}, "size below 1"),
    "int-eps": ({**_LLAMA, "rms_norm_eps": 1}, "rms_norm_eps"),
    "int-tie": ({**_LLAMA, "tie_word_embeddings": 1}, "tie_word_embeddings"),
    "float-vocab": ({**_LLAMA, "vocab_size": 1000.0}, "vocab_size"),
    "str-eos": ({**_LLAMA, "eos_token_id": "2"}, "eos_token_id"),
    "null-bias": ({**_LLAMA, "attention_bias": None}, "attention_bias"),
    "qwen3-null-head-dim": ({**_LLAMA, "model_type": "qwen3", "head_dim": None}, "head_dim"),
    "qwen2-null-head-dim": ({**_QWEN2, "head_dim": None}, "head_dim"),
    "mistral-null-kv": (
        {**_LLAMA, "model_type": "mistral", "num_key_value_heads": None},
        "num_key_value_heads",
    ),
    "pad-outside-vocab": ({**_LLAMA, "vocab_size": 100, "pad_token_id": 100}, "pad_token_id"),
    "bad-dtype": ({**_LLAMA, "torch_dtype": "bogus"}, "torch_dtype"),
    "bad-quantization": ({**_LLAMA, "quantization_config": "fp8"}, "quantization_config"),
    "other-model": ({**_LLAMA, "model_type": "gemma"}, "model type"),
    "other-moe-model": ({**_LLAMA, "model_type": "phimoe"}, "model type"),
    "no-model-type": ({k: v for k, v in _LLAMA.items() if k != "model_type"}, "model type"),
}


@pytest.mark.parametrize("config,why", list(_REFUSED.values()), ids=list(_REFUSED))
def test_refused(tmp_path, config, why):
    assert_refused(tmp_path, config, why)


def test_unreadable_files_are_refused(tmp_path):
    assert read_config(str(tmp_path)) is None  # no config.json
    (tmp_path / "config.json").write_text("{not json")
    assert read_config(str(tmp_path)) is None
    (tmp_path / "config.json").write_text("[1, 2]")
    assert read_config(str(tmp_path)) is None
