"""Which row keys are refused as near misses of a sampling parameter, or as another tool's option
(io/param_keys.py), and which are data."""

from __future__ import annotations

import pytest

from batchgen.config import PARAM_NAMES
from batchgen.io.param_keys import UNSUPPORTED, key_problem
from batchgen.io.row_parser import RowSpec, UnknownKey, parse_overrides


@pytest.mark.parametrize(
    "key, name",
    [
        ("temprature", "temperature"), ("max_token", "max_tokens"), ("topp", "top_p"), ("topP", "top_p"),
        ("Top-K", "top_k"), ("logprob", "logprobs"), ("presence_penality", "presence_penalty"),
        ("frequencypenalty", "frequency_penalty"), ("stop_token_id", "stop_token_ids"),
    ],
)  # fmt: skip
def test_near_misses_name_the_parameter(key, name):
    assert f"did you mean {name!r}" in key_problem(key)


@pytest.mark.parametrize("key", ["best_of", "num_beams", "use_beam_search", "guided_json", "do_sample"])
def test_other_tools_options_are_refused_with_what_to_use(key):
    problem = key_problem(key)
    assert "batchgen has no such option" in problem
    instead = UNSUPPORTED[key]
    assert (f"use {instead!r}" in problem) == (instead is not None)


@pytest.mark.parametrize(
    "key",
    ["question", "answer", "text", "choice", "step", "seeds", "stops", "temp", "label", "topic", "context",
     "system", "n_samples", "seed_text", "category", "repetition", "frequency"],
)  # fmt: skip
def test_data_columns_are_left_alone(key):
    assert key_problem(key) is None


def test_every_parameter_name_and_alias_is_accepted():
    assert all(key_problem(name) is None for name in PARAM_NAMES)


def test_row_overrides_by_vllm_name_and_alias():
    row = {"prompt": "p", "max_tokens": 5, "min_p": 0.1, "logit_bias": {"3": 200}, "stop_token_ids": 7.0}
    assert parse_overrides(row) == {
        "max_new_tokens": 5, "min_p": 0.1, "logit_bias": ((3, 100.0),), "stop_token_ids": (7,),
    }  # fmt: skip
    with pytest.raises(ValueError, match="differ"):
        parse_overrides({"max_tokens": 5, "max_new_tokens": 6})
    with pytest.raises(ValueError, match="min_p must be a number"):
        parse_overrides({"min_p": "high"})


def test_a_row_key_near_miss_is_a_row_error_unless_it_is_read_as_data():
    assert "did you mean 'temperature'" in RowSpec().parse(0, {"prompt": "p", "temprature": 1}).error
    spec = RowSpec(template="{temprature}", keep_columns=("max_token",))
    parsed = spec.parse(0, {"temprature": "x", "max_token": 1})
    assert parsed.prompt == "x" and parsed.kept == {"max_token": 1}
    with pytest.raises(UnknownKey, match="row 4: unknown sampling key 'topp'"):
        RowSpec().check_keys(["prompt", "topp"], "row 4")
