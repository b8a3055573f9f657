"""SamplingParams (config.py): vLLM's parameters, their checks, and their values as rows give them."""

from __future__ import annotations

import math

import pytest

from batchgen.config import MAX_LOGPROBS, PARAMS, EngineConfig, SamplingParams
from batchgen.model.weights.choose_format import weight_format


def test_values_are_coerced_as_rows_give_them():
    p = SamplingParams(
        stop="x", stop_token_ids=[3, 1], logit_bias={"7": -500, 2: 0.5}, top_k=-1, logprobs=True
    )
    assert p.stop == ("x",) and p.stop_token_ids == (3, 1)
    assert p.logit_bias == ((2, 0.5), (7, -100.0))  # sorted, clipped to [-100, 100]
    assert p.top_k == 0 and p.logprobs == 0
    assert SamplingParams(logprobs=False).logprobs is None
    assert SamplingParams(logit_bias='{"5": 1}').logit_bias == ((5, 1.0),)


@pytest.mark.parametrize(
    "fields, needle",
    [
        ({"min_p": 1.5}, "min_p must be in [0, 1]"), ({"top_p": 0.0}, "top_p must be in (0, 1]"),
        ({"repetition_penalty": 0.0}, "repetition_penalty must be in (0, inf)"),
        ({"presence_penalty": 3}, "presence_penalty must be in [-2, 2]"),
        ({"min_tokens": 9, "max_new_tokens": 8}, "min_tokens (9) must not exceed max_tokens (8)"),
        ({"logprobs": MAX_LOGPROBS + 1}, "logprobs must be in [0, 20]"),
        ({"stop_token_ids": [-1]}, "stop_token_ids must be token ids >= 0"),
        ({"logit_bias": {"x": 1}}, "logit_bias keys must be token ids"),
        ({"temperature": "hot"}, "temperature must be a number"), ({"n": 1.5}, "n must be an integer"),
        ({"temperature": math.nan}, "temperature must be a number"),
        ({"json_schema": "{", "regex": None}, "json_schema is not valid JSON"),
    ],
)  # fmt: skip
def test_bad_values_are_refused_naming_the_parameter(fields, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        SamplingParams(**fields)


def test_which_parts_a_row_uses():
    assert not SamplingParams().penalized and not SamplingParams().adjusted
    assert SamplingParams(repetition_penalty=1.1).penalized and SamplingParams(frequency_penalty=-1).penalized
    assert SamplingParams(min_tokens=2).adjusted and SamplingParams(logit_bias={"1": 1}).adjusted


def test_every_parameter_has_a_kind_and_help():
    assert all(param.kind and param.help for param in PARAMS.values())
    assert "max_tokens" in PARAMS["max_new_tokens"].aliases


def test_the_constructor_takes_vllm_names():
    params = SamplingParams(max_tokens=64, temperature=0.8)
    assert params.max_new_tokens == 64 and params.max_tokens == 64
    assert params.with_overrides(min_p=0.1).max_tokens == 64  # a copy keeps it
    with pytest.raises(TypeError, match="give max_new_tokens or max_tokens, not both"):
        SamplingParams(max_tokens=64, max_new_tokens=32)
    with pytest.raises(TypeError):
        SamplingParams(max_token=64)  # a misspelt keyword is not an alias


@pytest.mark.parametrize(
    "build", [lambda q: EngineConfig(quantization=q), lambda q: weight_format(None, None, q)]
)
def test_an_unknown_quantization_is_refused_by_the_one_check(build):
    with pytest.raises(ValueError, match="unknown quantization 'awq' \\(supported: fp8\\)"):
        build("awq")
