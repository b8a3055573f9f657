"""``model/files/checkpoint_config.py`` against transformers: ``AutoConfig.from_pretrained`` + ``describe`` of
a meta skeleton is the oracle, field by field (``inv_freq`` bit for bit). Configs are written as config.json
files; no weights are needed."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
from transformers import AutoConfig

from batchgen.model.build import meta_skeleton
from batchgen.model.files.checkpoint_config import FileConfig, model_spec, read_config
from batchgen.model.spec import describe
from tests.model.config_cases import LLAMA31, MINIMAL, SHARED_FIELDS, SMALL, assert_same_spec, write_config
from tests.support.models import TINY_CONFIGS

DENSE = ("llama", "mistral", "qwen2", "qwen3")
_LLAMA31_SIZES = dict(hidden_size=256, num_attention_heads=2, head_dim=128, max_position_embeddings=131072)

_FULL = {
    "llama": dict(
        vocab_size=1000,
        hidden_size=96,
        intermediate_size=200,
        num_hidden_layers=3,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=32,
        hidden_act="silu",
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=[0, 5],
        pad_token_id=3,
        attention_bias=True,
        mlp_bias=True,
        rope_parameters={"rope_type": "default", "rope_theta": 250000.0},
        torch_dtype="bfloat16",
        architectures=["LlamaForCausalLM"],
        initializer_range=0.01,
        use_cache=False,
        pretraining_tp=1,
    ),
    "mistral": dict(
        vocab_size=1000,
        hidden_size=128,
        intermediate_size=200,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=64,
        hidden_act="swish",
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=None,
        rope_theta=1000000.0,
        sliding_window=512,
        dtype="float16",
    ),
    "qwen2": dict(
        vocab_size=1000,
        hidden_size=96,
        intermediate_size=200,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=7,
        eos_token_id=8,
        use_sliding_window=False,
        sliding_window=4096,
        max_window_layers=1,
        rope_theta=1000000.0,
        rope_scaling=None,
        attention_dropout=0.0,
    ),
    "qwen3": dict(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=200,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=16,
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=7,
        eos_token_id=[8, 9],
        attention_bias=True,
        use_sliding_window=True,
        sliding_window=128,
        max_window_layers=1,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    ),
}


def _assert_matches(path: str) -> FileConfig:
    """read_config + model_spec == transformers' config + describe(meta skeleton), field by field."""
    hf = AutoConfig.from_pretrained(path)
    cfg = read_config(path)
    assert cfg is not None
    for name in SHARED_FIELDS:
        assert getattr(cfg, name) == getattr(hf, name), (name, getattr(cfg, name), getattr(hf, name))
    assert cfg.head_dim == (getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads)
    assert cfg.quantization_config == getattr(hf, "quantization_config", None)
    assert_same_spec(model_spec(cfg), describe(meta_skeleton(hf)))
    return cfg


@pytest.mark.parametrize("model_type", DENSE)
def test_every_default_applies(tmp_path, model_type):
    """No sizes at all (a 32-layer skeleton on the meta device costs nothing), then only the sizes."""
    bare = _assert_matches(write_config(tmp_path / "bare", {"model_type": model_type}))
    minimal = _assert_matches(write_config(tmp_path / "minimal", {"model_type": model_type, **MINIMAL}))
    assert (bare.head_dim, minimal.head_dim) == ((128, 128) if model_type == "qwen3" else (128, 8))
    assert minimal.num_key_value_heads == {"llama": 32, "mistral": 8}.get(model_type, 32)
    assert minimal.sliding_windows == ((4096, 4096) if model_type == "mistral" else (None, None))


@pytest.mark.parametrize("model_type", DENSE)
def test_every_field_given(tmp_path, model_type):
    _assert_matches(write_config(tmp_path, {"model_type": model_type, **_FULL[model_type]}))


@pytest.mark.parametrize(
    "config",
    [
        dict(model_type="llama", **SMALL, head_dim=32),  # head_dim != hidden / heads
        dict(model_type="qwen2", **SMALL, head_dim=8),  # Qwen2Config has no head_dim field
        dict(model_type="mistral", **SMALL, head_dim=None),
        dict(model_type="llama", **{**SMALL, "num_key_value_heads": 1}),  # MQA
        dict(model_type="qwen3", **{**SMALL, "num_key_value_heads": None}),
        dict(model_type="qwen2", **{**MINIMAL, "num_attention_heads": 64}),  # Qwen's default: 32 KV heads
        dict(model_type="llama", **SMALL, tie_word_embeddings=True, pad_token_id=-1),
        dict(
            model_type="qwen3",
            **SMALL,
            quantization_config={"quant_method": "fp8", "weight_block_size": [128, 128]},
        ),
    ],
    ids=[
        "head-dim",
        "qwen2-head-dim",
        "null-head-dim",
        "mqa",
        "null-kv",
        "default-kv",
        "tied-pad-minus-one",
        "quantized",
    ],
)
def test_shapes(tmp_path, config):
    _assert_matches(write_config(tmp_path, config))


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3"])
@pytest.mark.parametrize(
    "window",
    [
        dict(use_sliding_window=True, sliding_window=64, max_window_layers=1),
        dict(use_sliding_window=True, max_window_layers=2),  # the default window
        dict(use_sliding_window=True, sliding_window=None, max_window_layers=0),
        dict(use_sliding_window=False, sliding_window=64, max_window_layers=0),
        dict(
            use_sliding_window=True,
            sliding_window=32,
            layer_types=["sliding_attention", "full_attention"] * 2,
        ),
        dict(use_sliding_window=True, sliding_window=32, layer_types=["full_attention"] * 4),
        dict(use_sliding_window=False, layer_types=["full_attention"] * 4),
    ],
    ids=[
        "max-window-layers",
        "default-window",
        "null-window",
        "unused",
        "layer-types",
        "all-full",
        "no-window",
    ],
)
def test_qwen_sliding_windows(tmp_path, model_type, window):
    config = {"model_type": model_type, **SMALL, "num_hidden_layers": 4, **window}
    cfg = _assert_matches(write_config(tmp_path, config))
    assert len(cfg.sliding_windows) == 4


@pytest.mark.parametrize(
    "window", [{"sliding_window": None}, {"sliding_window": 100}, {}], ids=["null", "100", "absent"]
)
def test_mistral_sliding_window(tmp_path, window):
    cfg = _assert_matches(write_config(tmp_path, {"model_type": "mistral", **SMALL, **window}))
    assert cfg.sliding_windows == (window.get("sliding_window", 4096),) * 3


_ROPE_CASES = {
    "default-old": dict(rope_theta=500000.0),
    "default-old-int-theta": dict(rope_theta=500000),
    "default-new": dict(rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
    "default-new-no-theta": dict(rope_parameters={"rope_type": "default"}, rope_theta=20000.0),
    "default-old-type-key": dict(rope_scaling={"type": "default"}, rope_theta=30000.0),
    "full-partial-rotary": dict(rope_theta=20000.0, partial_rotary_factor=1.0),
    "linear-old": dict(rope_theta=20000.0, rope_scaling={"type": "linear", "factor": 4.0}),
    "linear-old-int-factor": dict(rope_scaling={"rope_type": "linear", "factor": 2}),
    "linear-new": dict(rope_parameters={"rope_type": "linear", "factor": 2.5, "rope_theta": 20000.0}),
    "llama3-old": dict(**_LLAMA31_SIZES, rope_theta=500000.0, rope_scaling=LLAMA31),
    "llama3-new": dict(**_LLAMA31_SIZES, rope_parameters={**LLAMA31, "rope_theta": 500000.0}),
    "llama3-default-original-length": dict(
        **_LLAMA31_SIZES, rope_theta=500000.0,
        rope_scaling={k: v for k, v in LLAMA31.items() if k != "original_max_position_embeddings"},
    ),
}  # fmt: skip


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
@pytest.mark.parametrize("rope", list(_ROPE_CASES.values()), ids=list(_ROPE_CASES))
def test_rope(tmp_path, model_type, rope):
    config = {"model_type": model_type, **{**SMALL, "num_hidden_layers": 1}, **rope}
    if model_type == "qwen3" and "head_dim" not in rope:
        config["head_dim"] = 16  # else Qwen3's default 128
    _assert_matches(write_config(tmp_path, config))


@pytest.mark.parametrize("arch", DENSE)
def test_configs_saved_by_transformers(tmp_path, arch):
    """The layout batchgen's tiny test models (and the embedded model, converted from GGUF) have."""
    AutoConfig.for_model(**TINY_CONFIGS[arch]).save_pretrained(tmp_path)
    _assert_matches(str(tmp_path))


def test_llama3_rope_saved_by_transformers(tmp_path):
    config = AutoConfig.for_model(
        "llama", **_LLAMA31_SIZES, num_hidden_layers=1, rope_parameters=dict(LLAMA31)
    )
    config.save_pretrained(tmp_path)
    _assert_matches(str(tmp_path))


def test_the_embedded_model(default_model_path):
    _assert_matches(default_model_path)


def test_a_file_config_reads_like_a_transformers_config(tmp_path):
    cfg = read_config(write_config(tmp_path, {"model_type": "qwen3", **SMALL}))
    assert cfg.get_text_config() is cfg and cfg.get_text_config(decoder=True) is cfg
    assert getattr(cfg, "moe_intermediate_size", 0) is None
    assert getattr(cfg, "shared_expert_intermediate_size", 0) is None
    assert getattr(cfg, "num_experts", None) is None
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    assert cfg.raw == {"model_type": "qwen3", **SMALL}
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.vocab_size = 1
