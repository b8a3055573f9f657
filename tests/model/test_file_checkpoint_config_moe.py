"""``model/files/moe_config.py`` (through ``read_config``) against transformers, for the MoE architectures:
``AutoConfig.from_pretrained`` + ``describe`` of a meta skeleton is the oracle for the spec, field by field
(``inv_freq`` bit for bit), and the skeleton's decoder layers (``layout_of``) for each layer's MLP. Configs
are written as config.json files; no weights are needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoConfig

from batchgen.config import EngineConfig
from batchgen.distributed.shard import config_problem
from batchgen.model.build import ModelFiles, choose_forward, meta_skeleton
from batchgen.model.files.checkpoint_config import FileConfig, model_spec, read_config
from batchgen.model.loader import open_checkpoint
from batchgen.model.moe_layout import MoELayout, Routing, layout_of
from batchgen.model.spec import describe
from tests.model.config_cases import SHARED_FIELDS, assert_refused, assert_same_spec
from tests.support.models import MOE_ARCHS, TINY_CONFIGS

_EXPERT_SIZES = ("moe_intermediate_size", "shared_expert_intermediate_size")
_MINIMAL = dict(
    hidden_size=256, num_attention_heads=32, num_hidden_layers=2, intermediate_size=128, vocab_size=999
)
_SMALL = dict(
    hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=4, intermediate_size=96
)
_QWEN_EXPERTS = dict(moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2)
_EXPERTS = {  # 8 experts, top 2, as each type names them
    "qwen3_moe": _QWEN_EXPERTS, "qwen2_moe": _QWEN_EXPERTS,
    "mixtral": dict(num_local_experts=8, num_experts_per_tok=2),
    "olmoe": dict(num_experts=8, num_experts_per_tok=2),
}  # fmt: skip
_QWEN3_MOE = {"model_type": "qwen3_moe", **_SMALL, **_QWEN_EXPERTS}
_QWEN2_MOE = {"model_type": "qwen2_moe", **_SMALL, **_QWEN_EXPERTS}
_MIXTRAL = {"model_type": "mixtral", **_SMALL}
_OLMOE = {"model_type": "olmoe", **_SMALL}


def _write(directory: Path, config: dict) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    return str(directory)


def _assert_matches(path: str) -> FileConfig:
    """read_config + model_spec == transformers' config + describe(meta skeleton); each layer's layout ==
    the skeleton layer's; and the structure ``choose_forward`` gives both configs is the same."""
    hf = AutoConfig.from_pretrained(path)
    cfg = read_config(path)
    assert cfg is not None
    for name in (*SHARED_FIELDS, *_EXPERT_SIZES):
        assert getattr(cfg, name) == getattr(hf, name, None), (
            name,
            getattr(cfg, name),
            getattr(hf, name, None),
        )
    assert cfg.quantization_config == getattr(hf, "quantization_config", None)
    skeleton = meta_skeleton(hf)
    assert_same_spec(model_spec(cfg), describe(skeleton))
    assert cfg.moe_layouts == tuple(layout_of(hf.model_type, layer) for layer in skeleton.model.layers)
    from_file, from_skeleton = (
        choose_forward(EngineConfig(), ModelFiles(path, c)).structure for c in (cfg, hf)
    )
    assert_same_spec(from_file.spec, from_skeleton.spec)
    assert list(from_file.layers) == list(from_skeleton.layers)
    for size in (1, 2, 3, 4, 8):
        assert config_problem(cfg, size) == config_problem(hf, size), size
    return cfg


# The defaults of transformers 5.24's config classes, as each layer's MLP takes them.
_DEFAULT_LAYOUTS = {
    "qwen3_moe": MoELayout(Routing(128, 8, False, False), 768, None),
    "qwen2_moe": MoELayout(Routing(60, 4, False, False), 1408, 5632),
    "mixtral": MoELayout(Routing(8, 2, True, True), 14336, None),
    "olmoe": MoELayout(Routing(64, 8, False, False), 2048, None),
}


@pytest.mark.parametrize("model_type", MOE_ARCHS)
def test_every_default_applies(tmp_path, model_type):
    """No sizes at all (a full-size skeleton on the meta device costs nothing), then only the sizes."""
    bare = _assert_matches(_write(tmp_path / "bare", {"model_type": model_type}))
    minimal = _assert_matches(_write(tmp_path / "minimal", {"model_type": model_type, **_MINIMAL}))
    assert set(bare.moe_layouts) == {_DEFAULT_LAYOUTS[model_type]}
    assert bare.sliding_windows == (None,) * bare.num_hidden_layers
    assert bare.rope_parameters["rope_theta"] == (1e6 if model_type == "mixtral" else 1e4)
    assert minimal.head_dim == 8 and minimal.moe_layouts[0].routing == _DEFAULT_LAYOUTS[model_type].routing


_FULL = {  # shaped like Qwen3-30B-A3B, Qwen1.5-MoE-A2.7B, Mixtral-8x7B and OLMoE-1B-7B's config.json
    "qwen3_moe": dict(
        architectures=["Qwen3MoeForCausalLM"], attention_bias=False, attention_dropout=0.0, bos_token_id=7,
        eos_token_id=8, decoder_sparse_step=1, head_dim=16, hidden_act="silu", hidden_size=64,
        initializer_range=0.02, intermediate_size=96, max_position_embeddings=40960, max_window_layers=3,
        mlp_only_layers=[], moe_intermediate_size=24, norm_topk_prob=True, num_attention_heads=8,
        num_experts=16, num_experts_per_tok=4, num_hidden_layers=3, num_key_value_heads=2,
        output_router_logits=False, rms_norm_eps=1e-6, rope_scaling=None, rope_theta=1000000.0,
        router_aux_loss_coef=0.001, sliding_window=None, tie_word_embeddings=False, torch_dtype="bfloat16",
        transformers_version="4.51.0", use_cache=True, use_sliding_window=False, vocab_size=1000,
    ),
    "qwen2_moe": dict(
        architectures=["Qwen2MoeForCausalLM"], attention_dropout=0.0, bos_token_id=7, eos_token_id=8,
        decoder_sparse_step=1, hidden_act="silu", hidden_size=64, initializer_range=0.02,
        intermediate_size=160, max_position_embeddings=8192, max_window_layers=21, moe_intermediate_size=32,
        norm_topk_prob=False,
        num_attention_heads=4, num_experts=12, num_experts_per_tok=3, num_hidden_layers=3,
        num_key_value_heads=4, output_router_logits=False, qkv_bias=True, rms_norm_eps=1e-6,
        rope_theta=1000000.0, router_aux_loss_coef=0.001, shared_expert_intermediate_size=128,
        sliding_window=32768, tie_word_embeddings=True, torch_dtype="bfloat16", use_cache=True,
        use_sliding_window=False, vocab_size=1000,
    ),
    "mixtral": dict(
        architectures=["MixtralForCausalLM"], attention_dropout=0.0, bos_token_id=1, eos_token_id=[2, 5],
        head_dim=32, hidden_act="silu", hidden_size=64, initializer_range=0.02, intermediate_size=112,
        max_position_embeddings=32768, num_attention_heads=4, num_experts_per_tok=2, num_hidden_layers=2,
        num_key_value_heads=2, num_local_experts=8, output_router_logits=False, pad_token_id=0,
        rms_norm_eps=1e-5, rope_theta=1e6, router_aux_loss_coef=0.02, router_jitter_noise=0.0,
        sliding_window=None, tie_word_embeddings=False, torch_dtype="bfloat16", use_cache=True,
        vocab_size=1000,
    ),
    "olmoe": dict(
        architectures=["OlmoeForCausalLM"], attention_bias=False, attention_dropout=0.0, clip_qkv=None,
        eos_token_id=900, hidden_act="silu", hidden_size=64, initializer_range=0.02, intermediate_size=32,
        max_position_embeddings=4096, norm_topk_prob=False, num_attention_heads=4, num_experts=16,
        num_experts_per_tok=4, num_hidden_layers=2, num_key_value_heads=4, output_router_logits=False,
        pad_token_id=1, rms_norm_eps=1e-5, rope_scaling=None, rope_theta=10000.0, router_aux_loss_coef=0.01,
        tie_word_embeddings=False, torch_dtype="bfloat16", use_cache=True, vocab_size=1000,
    ),
}  # fmt: skip


@pytest.mark.parametrize("model_type", MOE_ARCHS)
def test_every_field_given(tmp_path, model_type):
    _assert_matches(_write(tmp_path, {"model_type": model_type, **_FULL[model_type]}))


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_configs_saved_by_transformers(tmp_path, arch):
    """The layout of batchgen's tiny test models: Qwen3-MoE's count saved as num_local_experts, Qwen2-MoE's
    window saved as 0 (its config's value when use_sliding_window is false)."""
    AutoConfig.for_model(**TINY_CONFIGS[arch]).save_pretrained(tmp_path)
    _assert_matches(str(tmp_path))


_SPARSITY = {
    "every-layer": {},
    "step-2": dict(decoder_sparse_step=2),
    "step-3": dict(decoder_sparse_step=3),
    "step-above-layers": dict(decoder_sparse_step=5),
    "mlp-only": dict(mlp_only_layers=[0, 2]),
    "mlp-only-and-step": dict(mlp_only_layers=[1], decoder_sparse_step=2),
    "mlp-only-outside": dict(mlp_only_layers=[-1, 7]),
    "mlp-only-null": dict(mlp_only_layers=None),
    "all-dense": dict(mlp_only_layers=[0, 1, 2, 3]),
}


@pytest.mark.parametrize("model_type", ["qwen3_moe", "qwen2_moe"])
@pytest.mark.parametrize("sparsity", list(_SPARSITY.values()), ids=list(_SPARSITY))
def test_qwen_sparse_layers(tmp_path, model_type, sparsity):
    config = {"model_type": model_type, **_SMALL, **_QWEN_EXPERTS, **sparsity}
    cfg = _assert_matches(_write(tmp_path, config))
    assert len(cfg.moe_layouts) == 4


@pytest.mark.parametrize("model_type", MOE_ARCHS)
@pytest.mark.parametrize("norm", [True, False, None], ids=["renormalized", "not-renormalized", "absent"])
def test_norm_topk_prob(tmp_path, model_type, norm):
    """Mixtral's router renormalises whatever the config says (norm_topk_prob is no field of its)."""
    config = {"model_type": model_type, **_SMALL, **_EXPERTS[model_type]}
    if norm is not None:
        config["norm_topk_prob"] = norm
    cfg = _assert_matches(_write(tmp_path, config))
    assert cfg.moe_layouts[0].routing.renormalize == (model_type == "mixtral" or bool(norm))


@pytest.mark.parametrize(
    "shared",
    [dict(shared_expert_intermediate_size=64), dict(shared_expert_intermediate_size=48), {}],
    ids=["64", "48", "default"],
)
def test_qwen2_moe_shared_expert(tmp_path, shared):
    config = {"model_type": "qwen2_moe", **_SMALL, **_QWEN_EXPERTS, "decoder_sparse_step": 2, **shared}
    cfg = _assert_matches(_write(tmp_path, config))
    assert cfg.moe_layouts[1].shared_intermediate == shared.get("shared_expert_intermediate_size", 5632)


@pytest.mark.parametrize(
    "counts",
    [dict(num_local_experts=6), dict(num_experts=6), dict(num_experts=6, num_local_experts=6)],
    ids=["local", "plain", "both"],
)
@pytest.mark.parametrize("model_type", ["qwen3_moe", "mixtral", "olmoe"])
def test_expert_count_under_either_name(tmp_path, model_type, counts):
    """transformers' attribute_map makes num_experts and num_local_experts one value on these types."""
    config = {"model_type": model_type, **_SMALL, "num_experts_per_tok": 2, **counts}
    cfg = _assert_matches(_write(tmp_path, config))
    assert cfg.moe_layouts[0].routing.num_experts == 6


_QWEN_WINDOWS = {
    "used": dict(use_sliding_window=True, sliding_window=64),
    "default-window": dict(use_sliding_window=True),
    "unused": dict(use_sliding_window=False, sliding_window=64),
    "unused-zero": dict(use_sliding_window=False, sliding_window=0),
    "max-window-layers": dict(use_sliding_window=True, sliding_window=32, max_window_layers=3),
    "max-window-layers-0": dict(use_sliding_window=True, sliding_window=32, max_window_layers=0),
}
_QWEN2_MOE_LAYER_TYPES = {
    "layer-types": dict(
        use_sliding_window=True, sliding_window=32, layer_types=["full_attention", "sliding_attention"] * 2
    ),
    "all-full": dict(use_sliding_window=True, sliding_window=32, layer_types=["full_attention"] * 4),
    "no-window": dict(use_sliding_window=False, layer_types=["full_attention"] * 4),
}


@pytest.mark.parametrize("model_type", ["qwen3_moe", "qwen2_moe"])
@pytest.mark.parametrize("window", list(_QWEN_WINDOWS.values()), ids=list(_QWEN_WINDOWS))
def test_qwen_sliding_windows(tmp_path, model_type, window):
    """Qwen3-MoE slides every layer; Qwen2-MoE the layers its layer_types say (by default the even ones
    below max_window_layers, Qwen2's the layers from it on)."""
    cfg = _assert_matches(_write(tmp_path, {"model_type": model_type, **_SMALL, **_QWEN_EXPERTS, **window}))
    assert len(cfg.sliding_windows) == 4


def test_qwen3_moe_null_window(tmp_path):
    """Qwen3-MoE masks causally then (Qwen2-MoE still builds a sliding mask, which raises: refused)."""
    config = {**_QWEN3_MOE, "use_sliding_window": True, "sliding_window": None}
    assert _assert_matches(_write(tmp_path, config)).sliding_windows == (None,) * 4


@pytest.mark.parametrize("window", list(_QWEN2_MOE_LAYER_TYPES.values()), ids=list(_QWEN2_MOE_LAYER_TYPES))
def test_qwen2_moe_layer_types(tmp_path, window):
    _assert_matches(_write(tmp_path, {"model_type": "qwen2_moe", **_SMALL, **_QWEN_EXPERTS, **window}))


@pytest.mark.parametrize(
    "window", [{"sliding_window": None}, {"sliding_window": 100}, {}], ids=["null", "100", "absent"]
)
def test_mixtral_sliding_window(tmp_path, window):
    cfg = _assert_matches(_write(tmp_path, {"model_type": "mixtral", **_SMALL, **window}))
    assert cfg.sliding_windows == (window.get("sliding_window"),) * 4


@pytest.mark.parametrize(
    "shape",
    [
        dict(num_key_value_heads=2),  # q/k norms over widths 64 and 32
        dict(num_key_value_heads=None),
        dict(num_attention_heads=1, num_key_value_heads=1),  # describe reads a one-head norm as per head
        dict(head_dim=16),  # hidden / heads, spelled out
    ],
    ids=["gqa", "null-kv", "one-head", "head-dim"],
)
def test_olmoe_shapes(tmp_path, shape):
    _assert_matches(_write(tmp_path, {**_OLMOE, **shape}))


@pytest.mark.parametrize(
    "config",
    [
        {**_QWEN3_MOE, "num_key_value_heads": 4},
        {**_QWEN3_MOE, "head_dim": 8},
        {**_QWEN2_MOE, "head_dim": 32},  # no head_dim field
        {**_MIXTRAL, "head_dim": None},
        {**_MIXTRAL, "num_key_value_heads": 1},
        {**_QWEN3_MOE, "attention_bias": True},
        {**_QWEN2_MOE, "qkv_bias": False},
        {**_OLMOE, "attention_bias": True, "tie_word_embeddings": True, "pad_token_id": None},
        {**_QWEN3_MOE, "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}},
    ],  # fmt: skip
    ids=[
        "mha",
        "head-dim",
        "qwen2-moe-head-dim",
        "null-head-dim",
        "mqa",
        "bias",
        "no-qkv-bias",
        "tied",
        "fp8",
    ],
)
def test_shapes(tmp_path, config):
    _assert_matches(_write(tmp_path, config))


_ROPE_CASES = {
    "theta": dict(rope_theta=500000.0),
    "new-layout": dict(rope_parameters={"rope_type": "default", "rope_theta": 20000.0}),
    "new-layout-no-theta": dict(rope_parameters={"rope_type": "default"}),
    "linear": dict(rope_scaling={"type": "linear", "factor": 4.0}),
    "llama3": dict(
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
        max_position_embeddings=131072,
    ),
}


@pytest.mark.parametrize("model_type", MOE_ARCHS)
@pytest.mark.parametrize("rope", list(_ROPE_CASES.values()), ids=list(_ROPE_CASES))
def test_rope(tmp_path, model_type, rope):
    """Mixtral's theta defaults to 1e6, inside rope_parameters too; the others' to 1e4."""
    config = {"model_type": model_type, **{**_SMALL, "num_hidden_layers": 1}, **rope}
    _assert_matches(_write(tmp_path, config))


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_tiny_models_open_from_their_files(tiny_models, arch):
    """batchgen's tiny MoE checkpoints (the oracle and tensor-parallel tests' models) take this path."""
    checkpoint = open_checkpoint(tiny_models[arch], EngineConfig(model=tiny_models[arch]))
    assert isinstance(checkpoint.config, FileConfig)
    _assert_matches(tiny_models[arch])


_REFUSED = {
    "olmoe-clip-qkv": ({**_OLMOE, "clip_qkv": 8.0}, "clip_qkv"),
    "olmoe-window": ({**_OLMOE, "sliding_window": 16}, "sliding_window"),
    "olmoe-head-dim": ({**_OLMOE, "head_dim": 32}, "OLMoE"),
    "olmoe-null-head-dim": ({**_OLMOE, "head_dim": None}, "head_dim"),
    "olmoe-hidden-not-multiple": ({**_OLMOE, "num_attention_heads": 3, "num_key_value_heads": 3}, "OLMoE"),
    "qwen3-moe-layer-types": ({**_QWEN3_MOE, "layer_types": ["full_attention"] * 4}, "layer_types"),
    "mixtral-layer-types": ({**_MIXTRAL, "layer_types": ["full_attention"] * 4}, "layer_types"),
    "olmoe-layer-types": ({**_OLMOE, "layer_types": ["full_attention"] * 4}, "layer_types"),
    "qwen2-moe-local-experts": ({**_QWEN2_MOE, "num_local_experts": 8}, "num_local_experts"),
    "counts-differ": ({**_QWEN3_MOE, "num_local_experts": 4}, "num_experts 8 and num_local_experts 4"),
    "mixtral-counts-differ": (
        {**_MIXTRAL, "num_local_experts": 8, "num_experts": 4},
        "num_local_experts 8 and num_experts 4",
    ),
    "top-k-above-experts": ({**_QWEN3_MOE, "num_experts_per_tok": 9}, "top 9 of 8"),
    "top-k-zero": ({**_MIXTRAL, "num_experts_per_tok": 0}, "top 0"),
    "no-experts": ({**_QWEN2_MOE, "num_experts": 0}, "of 0 experts"),
    "sparse-step-zero": ({**_QWEN3_MOE, "decoder_sparse_step": 0}, "decoder_sparse_step"),
    "sparse-step-negative": ({**_QWEN2_MOE, "decoder_sparse_step": -2}, "decoder_sparse_step"),
    "mlp-only-floats": ({**_QWEN3_MOE, "mlp_only_layers": [1.0]}, "mlp_only_layers"),
    "mlp-only-bools": ({**_QWEN3_MOE, "mlp_only_layers": [True]}, "mlp_only_layers"),
    "mlp-only-int": ({**_QWEN2_MOE, "mlp_only_layers": 1}, "mlp_only_layers"),
    "norm-int": ({**_QWEN3_MOE, "norm_topk_prob": 1}, "norm_topk_prob"),
    "expert-size-zero": ({**_QWEN3_MOE, "moe_intermediate_size": 0}, "expert sizes"),
    "expert-size-float": ({**_QWEN3_MOE, "moe_intermediate_size": 32.0}, "moe_intermediate_size"),
    "qwen3-moe-null-kv": ({**_QWEN3_MOE, "num_key_value_heads": None}, "num_key_value_heads"),
    "qwen2-moe-null-kv": ({**_QWEN2_MOE, "num_key_value_heads": None}, "num_key_value_heads"),
    "mixtral-null-kv": ({**_MIXTRAL, "num_key_value_heads": None}, "num_key_value_heads"),
    "qwen3-moe-null-head-dim": ({**_QWEN3_MOE, "head_dim": None}, "head_dim"),
    "qwen3-moe-shared-size": ({**_QWEN3_MOE, "shared_expert_intermediate_size": 64}, "shared_expert"),
    "mixtral-moe-size": ({**_MIXTRAL, "moe_intermediate_size": 32}, "moe_intermediate_size"),
    "llama-moe-size": ({"model_type": "llama", **_SMALL, "moe_intermediate_size": 32}, "intermediate_size"),
    "qwen3-moe-zero-window": ({**_QWEN3_MOE, "use_sliding_window": True, "sliding_window": 0}, "window"),
    "qwen2-moe-sliding-unused": (
        {**_QWEN2_MOE, "layer_types": ["sliding_attention", "full_attention"] * 2},
        "without a sliding window",
    ),
    "qwen2-moe-sliding-null": (
        {**_QWEN2_MOE, "use_sliding_window": True, "sliding_window": None, "max_window_layers": 2},
        "without a sliding window",
    ),
    "qwen2-moe-null-window-no-sliding-layer": (
        {**_QWEN2_MOE, "use_sliding_window": True, "sliding_window": None, "max_window_layers": 0},
        "without a sliding window",
    ),
    "qwen2-moe-layer-types-length": ({**_QWEN2_MOE, "layer_types": ["full_attention"]}, "layer_types"),
    "moe-gelu": ({**_MIXTRAL, "hidden_act": "gelu"}, "activation"),
    "moe-yarn": ({**_OLMOE, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope"),
}  # fmt: skip


@pytest.mark.parametrize("config,why", list(_REFUSED.values()), ids=list(_REFUSED))
def test_refused(tmp_path, config, why):
    assert_refused(tmp_path, config, why)
