"""``batchgen run`` on an OpenAI Batch file, end to end on the embedded model: one response line per
request in input order, the same completions as the same prompts run as rows, error lines for the
requests that cannot be served, and after a SIGKILL (mid-run, or while the response file is written) a
re-run that ends with the bytes of an uninterrupted run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from batchgen.cli import main

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}  # fmt: skip
CHAT, TEXT = "/v1/chat/completions", "/v1/completions"
JSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}
GOOD = [
    ("chat", CHAT, {"model": "m", "messages": [{"role": "user", "content": "Name a colour."}], "n": 2,
                    "temperature": 0.8, "seed": 5, "max_tokens": 6}),
    ("text", TEXT, {"prompt": "The capital of France is", "max_tokens": 6}),
    ("json", CHAT, {"messages": [{"role": "user", "content": "Is water wet? Answer in JSON."}],
                    "max_completion_tokens": 24,
                    "response_format": JSON_FORMAT}),
]  # fmt: skip
BAD = [
    ("embed", "/v1/embeddings", {"input": "x"}, "url '/v1/embeddings' is not served"),
    ("empty", CHAT, {"max_tokens": 3}, "needs 'messages'"),
    ("typo", CHAT, {"messages": [{"role": "user", "content": "x"}], "temprature": 0.3}, "did you mean"),
]
# The good requests as rows: the same prompt and sampling keys (the completions one with --no-chat).
CHAT_ROWS = [
    {
        "id": "chat",
        "messages": GOOD[0][2]["messages"],
        "n": 2,
        "temperature": 0.8,
        "seed": 5,
        "max_tokens": 6,
    },
    {"id": "json", "messages": GOOD[2][2]["messages"], "max_tokens": 24, "json_schema": SCHEMA},
]
TEXT_ROWS = [{"id": "text", "prompt": "The capital of France is", "max_tokens": 6}]


def _jsonl(path: Path, rows: list) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def _batch_file(path: Path) -> Path:
    lines = [{"custom_id": cid, "method": "POST", "url": url, "body": body} for cid, url, body in GOOD]
    for i, (cid, url, body, _) in enumerate(BAD):  # among the good ones: the rest of the file runs
        lines.insert(1 + 2 * i, {"custom_id": cid, "method": "POST", "url": url, "body": body})
    return _jsonl(path, lines)


def _run(args: list[str]) -> int:
    with pytest.raises(SystemExit) as done:
        main(["run", *args])
    return done.value.code


def _lines(path: Path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


@pytest.fixture(scope="module")
def batch(default_model_path, tmp_path_factory):
    root = tmp_path_factory.mktemp("openai")
    source = _batch_file(root / "batch.jsonl")
    out = root / "out.jsonl"
    code = _run([str(source), str(out), "--model", default_model_path])
    return root, source, out, code


def test_each_request_gets_one_line_in_input_order(batch):
    _, source, out, code = batch
    assert code == 0
    sent = [orjson.loads(x)["custom_id"] for x in source.read_bytes().splitlines()]
    lines = _lines(out)
    assert [x["custom_id"] for x in lines] == sent
    assert [x["id"] for x in lines] == [f"batch_req_{i}" for i in range(len(sent))]


def test_the_bad_requests_are_error_lines_naming_the_cause(batch):
    lines = {x["custom_id"]: x for x in _lines(batch[2])}
    for cid, _, _, cause in BAD:
        line = lines[cid]
        assert line["response"]["status_code"] == 400
        assert cause in line["error"]["message"]
        assert cause in line["response"]["body"]["error"]["message"]


def test_completions_equal_the_same_prompts_run_as_rows(batch, default_model_path):
    root, _, out, _ = batch
    lines = {x["custom_id"]: x for x in _lines(out)}
    choices = {cid: lines[cid]["response"]["body"]["choices"] for cid, _, _ in GOOD}
    got = {
        cid: [c["message"]["content"] if "message" in c else c["text"] for c in cs]
        for cid, cs in choices.items()
    }
    rows_out, text_out = root / "rows.jsonl", root / "text.jsonl"
    model = ["--model", default_model_path]
    assert _run([str(_jsonl(root / "chat_rows.jsonl", CHAT_ROWS)), str(rows_out), *model]) == 0
    assert _run([str(_jsonl(root / "text_rows.jsonl", TEXT_ROWS)), str(text_out), "--no-chat", *model]) == 0
    expected: dict[str, list] = {}
    for record in sorted(_lines(rows_out) + _lines(text_out), key=lambda r: (r["id"], r["sample"])):
        expected.setdefault(record["id"], []).append(record["completion"])
    assert got == expected
    assert len(got["chat"]) == 2
    usage = lines["chat"]["response"]["body"]["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_the_json_schema_response_format_validates(batch):
    line = next(x for x in _lines(batch[2]) if x["custom_id"] == "json")
    content = line["response"]["body"]["choices"][0]["message"]["content"]
    assert set(json.loads(content)) == {"ok"}


@pytest.mark.parametrize("fault", ["output:2", "finalize:1"])
def test_killed_and_rerun_it_ends_byte_identical(batch, default_model_path, fault):
    root, source, out, _ = batch
    killed = root / f"killed-{fault.replace(':', '')}.jsonl"
    env = {**os.environ, "BATCHGEN_FAULT": fault, "OMP_NUM_THREADS": "1"}
    args = ["run", str(source), str(killed), "--model", default_model_path, "--flush-every", "0"]
    proc = subprocess.run([sys.executable, "-m", "batchgen", *args], env=env, capture_output=True)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    assert not killed.exists()  # the response file appears once, whole
    assert _run(args[1:]) == 0
    assert killed.read_bytes() == out.read_bytes()


def test_parquet_output_and_row_options_are_refused(batch, capsys):
    root, source, _, _ = batch
    assert _run([str(source), str(root / "o.parquet")]) == 2
    assert "is not .jsonl" in capsys.readouterr().err
    assert _run([str(source), str(root / "o.jsonl"), "--keep-columns", "x"]) == 2
    assert "--keep-columns: not for OpenAI Batch input" in capsys.readouterr().err
    assert not (root / "o.jsonl.batchgen").exists()
