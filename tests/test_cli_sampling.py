"""``batchgen run``'s sampling contract from the command line (the tiny random Llama): vLLM's parameter
names as options and row keys, their records (top and prompt log-probabilities), refusals of keys that
only look like parameters (exit 2 before the model loads; a row error further in), data columns left
alone, resume refusing a changed parameter, and --help in groups."""

from __future__ import annotations

import logging

import orjson
import pytest
from click.testing import CliRunner

from batchgen.cli import cli
from batchgen.cli_options import HELP_GROUPS
from batchgen.config import PARAMS
from tests.helpers import by_index, read_records, write_jsonl, write_parquet

pytestmark = pytest.mark.usefixtures("one_torch_thread")
ROWS = [{"id": "a", "prompt": "Hello there"}, {"id": "b", "prompt": "Count to five:"}]


@pytest.fixture
def run(tiny_llama):
    def _run(*args, stdin: bytes | None = None):
        argv = ["run", *map(str, args), "--model", tiny_llama, "--max-num-seqs", "4"]
        result = CliRunner().invoke(cli, argv, input=stdin, catch_exceptions=False)
        return result.exit_code, result.stderr

    return _run


def test_max_tokens_and_other_vllm_names_as_row_keys_and_options(run, tmp_path):
    rows = [
        {"prompt": "One", "max_tokens": 2},
        {"prompt": "Two", "max_new_tokens": 3, "min_tokens": 3, "stop_token_ids": [1, 2]},
        {"prompt": "Three", "repetition_penalty": 1.5, "logit_bias": {"5": 100}},
    ]
    inp, out = write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "out.jsonl"
    code, err = run(inp, out, "--max-tokens", "5", "--ignore-eos", "--return-tokens", "--min-p", "0.1")
    assert code == 0, err
    recs = by_index(read_records(out))
    assert [r["completion_tokens"] for r in recs] == [2, 3, 5]
    assert recs[2]["token_ids"] == [5] * 5  # a +100 bias wins every step, the penalty cannot undo it


def test_top_and_prompt_logprobs_in_jsonl_and_parquet(run, tmp_path):
    inp = write_jsonl(tmp_path / "in.jsonl", [*ROWS, {"prompt": "Alone", "logprobs": 1}])
    for name in ("out.jsonl", "out.parquet"):
        out = tmp_path / name
        code, err = run(inp, out, "--logprobs", "3", "--prompt-logprobs", "2", "--max-new-tokens", "4")
        assert code == 0, err
        recs = by_index(read_records(out))
        for rec in recs:
            n = 1 if rec["index"] == 2 else 3
            assert len(rec["logprobs"]) == len(rec["top_logprobs"]) == rec["completion_tokens"]
            for lp, top in zip(rec["logprobs"], rec["top_logprobs"], strict=True):
                assert len(top) == n and set(top[0]) == {"token_id", "token", "logprob"}
                assert [t["logprob"] for t in top] == sorted((t["logprob"] for t in top), reverse=True)
                assert lp <= top[0]["logprob"] + 1e-6
            assert len(rec["prompt_logprobs"]) == rec["prompt_tokens"] and rec["prompt_logprobs"][0] is None
            assert rec["prompt_top_logprobs"][0] is None and len(rec["prompt_top_logprobs"][1]) == 2


def test_logprobs_alone_gives_the_sampled_tokens_only(run, tmp_path):
    inp, out = write_jsonl(tmp_path / "in.jsonl", ROWS), tmp_path / "out.jsonl"
    assert run(inp, out, "--logprobs", "--max-new-tokens", "3")[0] == 0
    rec = read_records(out)[0]
    assert len(rec["logprobs"]) == rec["completion_tokens"] and "top_logprobs" not in rec


@pytest.mark.parametrize(
    "key, resembles",
    [("temprature", "temperature"), ("max_token", "max_tokens"), ("topp", "top_p"), ("best_of", "use 'n'")],
)
def test_a_misspelt_or_missing_sampling_key_is_refused_before_the_model_loads(run, tmp_path, key, resembles):
    rows = [ROWS[0], {"id": "b", "prompt": "x", key: 0.5}]
    inp, out = write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "out.jsonl"
    code, err = run(inp, out)
    assert code == 2, err
    line = err.strip().splitlines()[-1]
    assert key in line and resembles in line and "row 1" in line
    assert not out.exists()
    parquet = write_parquet(tmp_path / "in.parquet", rows)
    code, err = run(parquet, tmp_path / "out.parquet")
    assert code == 2 and key in err and "Parquet schema" in err


def test_a_misspelt_key_deep_in_a_file_is_refused_before_the_model_loads(run, tmp_path):
    """Every row of a JSONL file is read before the model loads, not only its head: row 150's key fails
    the run at once (exit 2, its row named), with nothing written."""
    rows = [{"prompt": f"row {i}"} for i in range(150)] + [{"id": "late", "prompt": "x", "temprature": 0.3}]
    inp, out = write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "out.jsonl"
    code, err = run(inp, out, "--max-new-tokens", "2")
    assert code == 2, err
    line = err.strip().splitlines()[-1]
    assert "'temprature'" in line and "temperature" in line and "row 150 (id 'late')" in line
    assert not out.exists() and not (tmp_path / "out.jsonl.batchgen").exists()


def test_a_misspelt_key_past_the_head_of_stdin_fails_only_its_row(run, tmp_path):
    """A stream is read once: past the head checked before the model loads, such a row is an error record."""
    rows = [{"prompt": f"row {i}"} for i in range(150)] + [{"prompt": "late", "temprature": 0.3}]
    out = tmp_path / "out.jsonl"
    code, err = run("-", out, "--max-new-tokens", "2", stdin=b"".join(orjson.dumps(r) + b"\n" for r in rows))
    assert code == 0, err
    late = by_index(read_records(out))[-1]
    assert (
        late["finish_reason"] == "error"
        and "'temprature'" in late["error"]
        and "temperature" in late["error"]
    )


def test_data_columns_are_never_refused(run, tmp_path):
    """Columns read by --template, kept, or merely present, even when they look like a parameter."""
    rows = [{"id": "a", "temprature": "warm", "max_token": "x", "choice": "B", "step": 3, "topic": "t"}]
    inp, out = write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "out.jsonl"
    code, err = run(inp, out, "--template", "It is {temprature}:", "--keep-columns", "max_token",
                    "--max-new-tokens", "2")  # fmt: skip
    assert code == 0, err
    assert read_records(out)[0]["max_token"] == "x"
    plain = write_jsonl(tmp_path / "plain.jsonl", [{"prompt": "p", "choice": "B", "step": 1, "seeds": 2}])
    assert run(plain, tmp_path / "plain-out.jsonl", "--max-new-tokens", "2")[0] == 0


def test_a_near_miss_flag_is_a_usage_error_naming_the_option(run, tmp_path):
    inp = write_jsonl(tmp_path / "in.jsonl", ROWS)
    code, err = run(inp, tmp_path / "out.jsonl", "--temprature", "0.5")
    assert code == 2 and "--temprature" in err and "--temperature" in err
    code, err = run(inp, tmp_path / "out.jsonl", "--min-p", "2")
    assert code == 2 and "min_p" in err


def test_n_greedy_samples_warn_once(run, tmp_path, caplog):
    inp, out = write_jsonl(tmp_path / "in.jsonl", ROWS), tmp_path / "out.jsonl"
    with caplog.at_level(logging.WARNING, logger="batchgen"):
        assert run(inp, out, "--n", "2", "--temperature", "0", "--max-new-tokens", "2")[0] == 0
    warned = [r for r in caplog.records if "identical" in r.getMessage()]
    assert len(warned) == 1


def test_a_resume_with_another_sampling_parameter_is_refused_naming_it(run, tmp_path):
    inp, out = write_jsonl(tmp_path / "in.jsonl", ROWS), tmp_path / "out.jsonl"
    assert run(inp, out, "--limit", "1", "--min-p", "0.1", "--max-new-tokens", "2")[0] == 0
    code, err = run(inp, out, "--min-p", "0.2", "--max-new-tokens", "2")
    assert code == 1 and "min_p: 0.1 -> 0.2" in err
    code, err = run(inp, out, "--min-p", "0.1", "--max-new-tokens", "2")
    assert code == 0, err
    assert len(read_records(out)) == 2


def test_resume_of_penalized_sampled_rows_equals_an_uninterrupted_run(run, tmp_path):
    rows = [{"prompt": f"Say {i}", "frequency_penalty": 0.7, "logit_bias": {"9": 2}, "min_tokens": 2}
            for i in range(6)]  # fmt: skip
    inp = write_jsonl(tmp_path / "in.jsonl", rows)
    flags = ("--temperature", "0.9", "--repetition-penalty", "1.3", "--seed", "5", "--logprobs", "2",
             "--max-new-tokens", "6")  # fmt: skip
    whole, parts = tmp_path / "whole.jsonl", tmp_path / "parts.jsonl"
    assert run(inp, whole, *flags)[0] == 0
    assert run(inp, parts, *flags, "--limit", "2")[0] == 0
    assert run(inp, parts, *flags)[0] == 0
    # the same records; log-probabilities to float32's rounding (other batches sum in another order)
    for got, want in zip(by_index(read_records(parts)), by_index(read_records(whole)), strict=True):
        numbers = ("logprobs", "top_logprobs")
        assert {k: v for k, v in got.items() if k not in numbers} == {
            k: v for k, v in want.items() if k not in numbers
        }
        assert got["logprobs"] == pytest.approx(want["logprobs"], abs=1e-4)
        assert [[t["token_id"] for t in top] for top in got["top_logprobs"]] == [
            [t["token_id"] for t in top] for top in want["top_logprobs"]
        ]


def test_help_lists_every_option_in_one_group():
    result = CliRunner().invoke(cli, ["run", "--help"])
    assert result.exit_code == 0
    params = [p.name for p in cli.commands["run"].params if not getattr(p, "hidden", False)]
    grouped = [name for names in HELP_GROUPS.values() for name in names]
    assert sorted(set(params) - {"input_path", "output"}) == sorted(set(grouped) - {"help"})
    for title in HELP_GROUPS:
        assert f"{title}:" in result.output
    assert all(f"--{name.replace('_', '-')}" in result.output for name in PARAMS)
