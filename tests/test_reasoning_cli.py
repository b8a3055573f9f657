"""``batchgen run --reasoning-parser`` on a tiny random model whose tokenizer has think tokens: the
``reasoning`` / ``completion`` split with thinking on and off (a row's ``chat_template_kwargs``), against
the same run without a parser; JSON after a block of free thinking; stop strings and max_tokens over the
whole output; Parquet columns; and the resume fingerprint."""

from __future__ import annotations

import json

import jsonschema
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from batchgen.app.options import RunOptions
from batchgen.cli import cli
from batchgen.config import EngineConfig
from batchgen.io.checkpoint import diff_fingerprints
from tests.helpers import FIELDS, by_index, read_records, write_jsonl
from tests.support.thinking import OPENING_TEMPLATE, QWEN3_TEMPLATE, build_thinking_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")

OFF = {"chat_template_kwargs": {"enable_thinking": False}}
ROWS = [{"id": "on", "prompt": "Hello"}, {"id": "off", "prompt": "Hello", **OFF}]
SCHEMA = {
    "type": "object",
    "properties": {
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "w": {"type": "string", "maxLength": 8},
    },
    "required": ["n", "w"],
}
CLOSE = "49153"  # </think>'s id: the embedded tokenizer's 49152 tokens, then <think> and </think>


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("thinking-cli")
    return {
        "opening": str(build_thinking_model(root / "opening", OPENING_TEMPLATE)),
        "qwen3": str(build_thinking_model(root / "qwen3", QWEN3_TEMPLATE)),
    }


def run(inp, out, model: str, *args, max_new_tokens: int = 12) -> tuple[int, str]:
    argv = ["run", str(inp), str(out), "--model", model, "--max-new-tokens", str(max_new_tokens), *args]
    result = CliRunner().invoke(cli, [*argv, "--max-num-seqs", "4"], catch_exceptions=False)
    return result.exit_code, result.stderr


def _records(path) -> dict[str, dict]:
    return {r["id"]: r for r in by_index(read_records(path))}


def test_thinking_on_and_off_split_as_the_text_without_a_parser(models, tmp_path):
    inp = write_jsonl(tmp_path / "in.jsonl", [*ROWS, {"id": "bad", "prompt": "x", "max_tokens": 0}])
    for name, args in (("auto", ()), ("none", ("--reasoning-parser", "none"))):
        code, err = run(inp, tmp_path / f"{name}.jsonl", models["opening"], *args)
        assert code == 0, err
    split, plain = _records(tmp_path / "auto.jsonl"), _records(tmp_path / "none.jsonl")
    bad, plain_bad = split.pop("bad"), plain.pop("bad")  # a row refused before generation: an error record
    assert list(plain_bad) == [*FIELDS, "error"] and list(bad) == [
        *FIELDS[:4],
        "reasoning",
        *FIELDS[4:],
        "error",
    ]
    assert bad["reasoning"] is None
    assert all(list(r) == FIELDS for r in plain.values())  # no parser: the records of before
    for r in split.values():
        assert list(r) == [*FIELDS[:4], "reasoning", *FIELDS[4:]]
        assert r["completion_tokens"] == plain[r["id"]]["completion_tokens"] == 12
    # On: the prompt opened the block and max_tokens cut it: all of it is thinking.
    assert split["on"]["finish_reason"] == "length" and split["on"]["completion"] == ""
    assert split["on"]["reasoning"] == plain["on"]["completion"] != ""
    # Off: the prompt holds a closed, empty block: no reasoning, the completion as without a parser.
    assert split["off"]["reasoning"] is None and split["off"]["completion"] == plain["off"]["completion"]
    assert plain["off"]["completion"] != plain["on"]["completion"]  # the row's template variable reached it


def test_json_after_a_block_of_free_thinking_and_lengths_over_the_whole_output(models, tmp_path):
    rows = [{**row, "logit_bias": {CLOSE: 2.25}} for row in ROWS]  # a few free tokens, then </think>
    inp, schema, out = write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "s.json", tmp_path / "out.jsonl"
    schema.write_text(json.dumps(SCHEMA))
    code, err = run(
        inp, out, models["opening"], "--json-schema", schema, "--return-tokens", max_new_tokens=40
    )
    assert code == 0, err
    records = _records(out)
    for r in records.values():
        assert r["finish_reason"] == "stop" and len(r["token_ids"]) == r["completion_tokens"] <= 40
        jsonschema.validate(json.loads(r["completion"]), SCHEMA)
    on = records["on"]
    assert on["reasoning"] and "{" not in on["reasoning"]  # it thought freely, then wrote the JSON
    assert on["token_ids"].count(int(CLOSE)) == 1 and on["token_ids"].index(int(CLOSE)) > 0
    assert records["off"]["reasoning"] is None  # no block: the grammar from the first token


def test_a_stop_string_inside_the_thinking_ends_the_row_there(models, tmp_path):
    inp = write_jsonl(tmp_path / "in.jsonl", ROWS[:1])
    code, err = run(inp, tmp_path / "free.jsonl", models["opening"])
    assert code == 0, err
    thought = _records(tmp_path / "free.jsonl")["on"]["reasoning"]
    stop = thought.split()[2]  # a word from the middle of the thinking
    code, err = run(inp, tmp_path / "stopped.jsonl", models["opening"], "--stop", stop)
    assert code == 0, err
    r = _records(tmp_path / "stopped.jsonl")["on"]
    assert r["finish_reason"] == "stop" and r["completion"] == ""
    assert r["reasoning"] == thought[: thought.index(stop)] and r["completion_tokens"] < 12


def test_parquet_records_hold_reasoning_after_completion_as_text(models, tmp_path):
    inp, out = write_jsonl(tmp_path / "in.jsonl", ROWS), tmp_path / "out.parquet"
    code, err = run(inp, out, models["opening"])
    assert code == 0, err
    schema = pq.read_schema(out)
    assert schema.names[:6] == ["id", "index", "sample", "completion", "reasoning", "finish_reason"]
    assert schema.field("reasoning").type == pa.string()
    assert {r["id"]: r["reasoning"] is None for r in read_records(out)} == {"on": False, "off": True}


def test_the_parser_in_effect_is_in_the_resume_fingerprint(models, tmp_path):
    inp, out = write_jsonl(tmp_path / "in.jsonl", ROWS), tmp_path / "out.jsonl"
    code, err = run(inp, out, models["qwen3"])
    assert code == 0, err
    records = _records(out)
    assert records["on"]["reasoning"] is None  # Qwen3's template opens no block: the model would
    code, err = run(inp, out, models["qwen3"], "--reasoning-parser", "qwen3")  # auto's choice: the same job
    assert code == 0 and "already complete" in err, err
    code, err = run(inp, out, models["qwen3"], "--reasoning-parser", "deepseek_r1")
    assert code == 1 and "reasoning_parser: 'qwen3' -> 'deepseek_r1'" in err, err
    code, err = run(inp, out, models["qwen3"], "--reasoning-parser", "deepseek_r1", "--overwrite")
    assert code == 0, err
    r1 = _records(out)["on"]  # DeepSeek-R1 thinks from its first token: cut by max_tokens, all thinking
    assert r1["completion"] == "" and r1["reasoning"] == records["on"]["completion"]


def _fingerprint(model: str, choice: str) -> dict:
    opts = RunOptions(
        input="in.jsonl", output="out.jsonl", reasoning_parser=choice, engine=EngineConfig(model=model)
    )
    return opts.fingerprint(model, {})


def test_a_model_without_think_tokens_keeps_the_fingerprint_of_before(models, default_model_path):
    plain = _fingerprint(default_model_path, "auto")
    assert "reasoning_parser" not in plain  # a state written before reasoning output existed: equal
    assert not diff_fingerprints(plain, _fingerprint(default_model_path, "none"))
    thinking = _fingerprint(models["qwen3"], "auto")
    assert thinking["reasoning_parser"] == "qwen3"
    assert not diff_fingerprints(thinking, _fingerprint(models["qwen3"], "qwen3"))
    assert "reasoning_parser" not in _fingerprint(models["qwen3"], "none")


def test_a_parser_named_for_a_model_without_think_tokens_fails_before_loading(
    models, tmp_path, default_model_path
):
    inp, out = write_jsonl(tmp_path / "in.jsonl", ROWS), tmp_path / "out.jsonl"
    code, err = run(inp, out, default_model_path, "--reasoning-parser", "qwen3")
    assert code == 1 and "--reasoning-parser qwen3: the model's tokenizer has no <think>" in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out.jsonl.batchgen").exists()
