"""``batchgen run`` with structured output, on the tiny random Llama: whatever a model says, its
completions validate, since every constraint here bounds its own length."""

import json
import re

import jsonschema
import pytest

from tests.helpers import by_index, read_records, write_jsonl

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SCHEMA = {
    "type": "object",
    "properties": {
        "label": {"enum": ["yes", "no"]},
        "n": {"type": "integer", "minimum": 0, "maximum": 9},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
        "note": {"type": "string", "maxLength": 6},
    },
    "required": ["label", "n", "tags", "note"],
}
ROWS = [
    {"id": "a", "prompt": "Label this."},
    {"id": "b", "prompt": "And this.", "temperature": 0.9},
    {"id": "c", "prompt": "Pick one.", "choices": ["red", "green", "blue"]},
    {"id": "d", "prompt": "A code?", "regex": "[A-Z]{2}-[0-9]{3}"},
    {"id": "e", "prompt": "Bad schema.", "json_schema": {"type": "strin"}},
    {"id": "f", "prompt": "Two constraints.", "regex": "a", "choices": ["a"]},
    {"id": "g", "prompt": "Own schema.", "json_schema": json.dumps({"enum": [1, 2]})},
]


def _valid(record: dict) -> None:
    text, row = record["completion"], ROWS[record["index"]]
    assert record["finish_reason"] == "stop", record
    if "choices" in row:
        assert text in row["choices"]
    elif "regex" in row:
        assert re.fullmatch(row["regex"], text), text
    else:
        schema = json.loads(row["json_schema"]) if "json_schema" in row else SCHEMA
        jsonschema.validate(json.loads(text), schema)
        skeleton = re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)  # compact: blanks only after ':' and ','
        assert re.fullmatch(r"(?:[^\s]|(?<=[:,]) )*", skeleton), text


def test_json_schema_file_per_row_constraints_and_resume(gen, tmp_path):
    schema, inp = tmp_path / "schema.json", write_jsonl(tmp_path / "in.jsonl", ROWS)
    schema.write_text(json.dumps(SCHEMA, indent=2))
    out, args = tmp_path / "out.jsonl", ("--json-schema", schema, "--n", "2", "--logprobs", "--seed", "5")
    code, err = gen(inp, out, *args, "--limit", "3", max_new_tokens=80)
    assert code == 0, err
    code, err = gen(inp, out, *args, max_new_tokens=80)  # resumes: rows 3.. are added
    assert code == 0, err
    records = by_index(read_records(out))
    assert [(r["id"], r["sample"]) for r in records] == [(x, s) for x in "abcdefg" for s in (0, 1)]
    errors = {r["id"]: r["error"] for r in records if r["finish_reason"] == "error"}
    assert set(errors) == {"e", "f"}
    assert "invalid json_schema" in errors["e"] and "exclude each other" in errors["f"]
    for r in records:
        if r["id"] not in errors:
            _valid(r)
            assert len(r["logprobs"]) == r["completion_tokens"]
    assert len({r["completion"] for r in records if r["id"] == "b"}) == 2  # sampled: the samples differ
    schema.write_text(json.dumps({**SCHEMA, "required": ["label"]}))
    code, err = gen(inp, out, *args, max_new_tokens=80)
    assert code == 1 and "sampling json_schema" in err


@pytest.mark.parametrize(
    "content, needle",
    [("{", "not valid JSON"), ('{"type": "strin"}', "Unsupported type"), ("[1]", "must be a JSON object")],
)
def test_an_unusable_json_schema_file_is_a_usage_error(gen, tmp_path, content, needle):
    schema, inp = tmp_path / "schema.json", write_jsonl(tmp_path / "in.jsonl", ROWS[:1])
    schema.write_text(content)
    code, err = gen(inp, tmp_path / "out.jsonl", "--json-schema", schema)
    assert code == 2 and f"--json-schema {schema}" in err and needle in err
    code, err = gen(inp, tmp_path / "out.jsonl", "--json-schema", tmp_path / "missing.json")
    assert code == 2 and "missing.json" in err
