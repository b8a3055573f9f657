"""Model configs as files for the config tests: the fields read as transformers reads them, the sizes
they share, writing one as a model directory's config.json, and the checks that compare or refuse one."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest
import torch

from batchgen.model.files.checkpoint_config import UnsupportedConfig, parse_config, read_config
from batchgen.model.spec import ModelSpec

# Read as transformers' config has them (head_dim: as the attention module derives it, below).
SHARED_FIELDS = (
    "model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "intermediate_size", "rms_norm_eps", "max_position_embeddings",
    "tie_word_embeddings", "hidden_act", "bos_token_id", "eos_token_id", "pad_token_id", "rope_parameters",
)  # fmt: skip
# Only the sizes a model needs: every other default of its config class applies.
MINIMAL = dict(
    hidden_size=256, num_attention_heads=32, num_hidden_layers=2, intermediate_size=128, vocab_size=999
)
SMALL = dict(
    hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=3, intermediate_size=96
)
LLAMA31 = {  # meta-llama/Llama-3.1-8B's rope_scaling
    "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
    "rope_type": "llama3",
}  # fmt: skip


def write_config(directory: Path, config: dict) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    return str(directory)


def assert_same_spec(got: ModelSpec, want: ModelSpec) -> None:
    for field in dataclasses.fields(ModelSpec):
        a, b = getattr(got, field.name), getattr(want, field.name)
        if isinstance(b, torch.Tensor):
            assert (a.dtype, a.device, a.shape) == (b.dtype, b.device, b.shape), field.name
            assert torch.equal(a, b), field.name
        else:
            assert type(a) is type(b) and a == b, (field.name, a, b)


def assert_refused(tmp_path, config: dict, why: str) -> None:
    """``parse_config`` raises naming ``why`` and leaves the dict as it was; ``read_config`` of it is None."""
    original = copy.deepcopy(config)
    with pytest.raises(UnsupportedConfig, match=why):
        parse_config(config)
    assert config == original
    assert read_config(write_config(tmp_path, config)) is None
