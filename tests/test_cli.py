"""End-to-end tests of ``batchgen run`` / ``status`` in this process (the tiny random Llama, real engine)."""

import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from batchgen import __version__
from batchgen.cli import cli
from batchgen.io.checkpoint import load_state
from tests.helpers import FIELDS, ROWS, by_index, read_records, write_jsonl, write_parquet

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_version_and_module_entry_point():
    assert __version__ in CliRunner().invoke(cli, ["--version"]).output
    out = subprocess.run([sys.executable, "-m", "batchgen", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and __version__ in out.stdout
    assert CliRunner().invoke(cli, ["run", "--help"]).exit_code == 0


def test_jsonl_run_writes_documented_records(gen, tmp_path):
    inp, out, stats = write_jsonl(tmp_path / "in.jsonl", ROWS), tmp_path / "out.jsonl", tmp_path / "s.json"
    code, err = gen(inp, out, "--keep-columns", "topic", "--stats-file", stats)
    assert code == 0, err
    records = by_index(read_records(out))
    assert [(r["id"], r["index"], r["sample"]) for r in records] == [(x, i, 0) for i, x in enumerate("abcde")]
    for r, row in zip(records, ROWS, strict=True):
        assert list(r) == [*FIELDS, "topic"]
        assert r["finish_reason"] in ("stop", "length") and isinstance(r["completion"], str)
        assert 0 < r["completion_tokens"] <= row.get("max_new_tokens", 4) and r["prompt_tokens"] > 0
        assert r["topic"] == row["topic"]
    summary = json.loads(stats.read_text())
    assert summary["status"] == "complete" and summary["rows"] == 5 and summary["errors"] == 0
    assert summary["completion_tokens"] == sum(r["completion_tokens"] for r in records)
    assert "complete: 5 rows" in err and "tok/s" in err
    startup = summary["startup"]  # where the time to the first token went
    phases = ("before_engine_s", "config_tokenizer_s", "model_s", "kv_cache_s")
    assert all(startup[k] >= 0 for k in phases) and startup["model_s"] > 0
    assert startup["first_token_s"] >= startup["ready_s"] >= sum(startup[k] for k in phases)
    assert "engine ready" in err
    state = load_state(out)
    assert state.complete and state.rows_done == 5 and state.total_rows == 5


def test_a_small_run_batches_only_the_requests_it_has(tiny_llama, tmp_path):
    """Fewer requests left than --max-num-seqs: the engine is built for those (no decode graphs for
    batches the run cannot form); a resumed run counts only the rows still to do."""
    inp, out, stats = write_jsonl(tmp_path / "in.jsonl", ROWS), tmp_path / "out.jsonl", tmp_path / "s.json"

    def run(*args):
        argv = [
            "run",
            inp,
            str(out),
            "--model",
            tiny_llama,
            "--max-new-tokens",
            "2",
            "--stats-file",
            str(stats),
        ]
        result = CliRunner().invoke(cli, [*argv, *args], catch_exceptions=False)
        assert result.exit_code == 0, result.stderr
        return json.loads(stats.read_text()), result.stderr

    summary, err = run("--n", "2", "--limit", "2")  # 2 rows x 2 samples, under the default 256
    assert summary["max_num_seqs"] == 4 and "batching at most 4 at a time" in err
    summary, _ = run("--n", "2")  # resumed: 3 rows x 2 samples left
    assert summary["max_num_seqs"] == 6 and summary["rows"] == 3
    out = tmp_path / "o2.jsonl"  # a fresh output (run() reads ``out``)
    assert run("--max-num-seqs", "3")[0]["max_num_seqs"] == 3  # 5 requests: the flag's 3 stands


def test_finished_run_rerun_does_nothing(gen, tmp_path):
    inp, out = write_jsonl(tmp_path / "in.jsonl", ROWS), tmp_path / "out.jsonl"
    assert gen(inp, out)[0] == 0
    before = out.read_bytes()
    code, err = gen(inp, out)
    assert code == 0 and "already complete" in err and out.read_bytes() == before


def test_mismatched_rerun_is_refused_naming_the_difference(gen, tmp_path):
    inp, out = write_jsonl(tmp_path / "in.jsonl", ROWS), tmp_path / "out.jsonl"
    assert gen(inp, out, "--limit", "2")[0] == 0
    code, err = gen(inp, out, "--limit", "2", max_new_tokens=5)
    assert code == 1 and "max_new_tokens: 4 -> 5" in err and "--overwrite" in err
    code, err = gen(inp, out, "--limit", "2", "--temperature", "0.5")
    assert code == 1 and "temperature: (unset) -> 0.5" in err
    write_jsonl(tmp_path / "in.jsonl", ROWS[::-1])
    code, err = gen(inp, out, "--limit", "2")
    assert code == 1 and "input" in err
    code, err = gen(inp, out, "--limit", "2", "--overwrite")
    assert code == 0 and [r["id"] for r in by_index(read_records(out))] == ["e", "d"]


def test_output_not_written_by_batchgen_is_refused(gen, tmp_path):
    inp, out = write_jsonl(tmp_path / "in.jsonl", ROWS), tmp_path / "out.jsonl"
    out.write_text('{"mine": 1}\n')
    code, err = gen(inp, out)
    assert code == 1 and "--overwrite" in err and out.read_text() == '{"mine": 1}\n'


def test_longer_limit_extends_a_finished_run(gen, tmp_path):
    inp, out = write_jsonl(tmp_path / "in.jsonl", ROWS), tmp_path / "out.parquet"
    assert gen(inp, out, "--limit", "2")[0] == 0
    first = by_index(read_records(out))
    code, err = gen(inp, out)
    assert code == 0 and "resuming" in err
    records = by_index(read_records(out))
    assert [r["index"] for r in records] == [0, 1, 2, 3, 4] and records[:2] == first


# -- bad input: every case in SPEC.md -------------------------------------------------------------------
def test_bad_rows_get_error_records_and_the_run_goes_on(gen, tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(
        b'{"id": "ok1", "prompt": "fine"}\n'
        b'{"id": "torn", "prompt": "oops\n'  # malformed JSON
        b'{"id": "noprompt", "text": "hi"}\n'  # missing prompt
        b'{"id": "wrongtype", "prompt": 42}\n'  # wrong type
        b'{"id": "badopt", "prompt": "x", "max_new_tokens": "many"}\n'
        b'{"id": "long", "prompt": "' + b"word " * 200 + b'"}\n'  # over-long prompt
        b'{"id": "ok2", "prompt": "also fine"}\n'
    )
    out = tmp_path / "out.jsonl"
    code, err = gen(inp, out, "--max-model-len", "64")
    assert code == 0, err
    recs = {r["index"]: r for r in read_records(out)}
    assert sorted(recs) == list(range(7))
    expect = {1: "malformed JSON", 2: "no prompt", 3: "must be a string", 4: "max_new_tokens", 5: "too long"}
    for index, needle in expect.items():
        r = recs[index]
        assert r["finish_reason"] == "error" and needle in r["error"], r
        assert r["completion"] == "" and r["completion_tokens"] == 0
    assert recs[1]["id"] == 1 and recs[2]["id"] == "noprompt"  # a malformed line's id is its index
    assert recs[5]["prompt_tokens"] >= 64
    assert all("error" not in recs[i] for i in (0, 6))
    assert "5 errors" in err


def test_on_error_skip_and_fail(gen, tmp_path):
    inp = write_jsonl(tmp_path / "in.jsonl", [ROWS[0], {"id": "bad", "prompt": 1}, ROWS[3]])
    code, _ = gen(inp, tmp_path / "skip.jsonl", "--on-error", "skip")
    assert code == 0 and [r["id"] for r in by_index(read_records(tmp_path / "skip.jsonl"))] == ["a", "d"]
    code, err = gen(inp, tmp_path / "fail.jsonl", "--on-error", "fail")
    assert code == 1
    line = err.strip().splitlines()[-1]
    assert line.startswith("batchgen: error: row 1 (id 'bad')") and "Traceback" not in err


def test_over_long_prompt_from_the_engine_limit(gen, tmp_path):
    inp = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "a " * 3000}, ROWS[0]])
    code, _ = gen(inp, tmp_path / "out.jsonl", "--no-chat")
    recs = by_index(read_records(tmp_path / "out.jsonl"))
    assert code == 0 and recs[0]["finish_reason"] == "error" and "too long" in recs[0]["error"]
    assert recs[1]["finish_reason"] != "error"


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"", "has no rows"),
        (b"\n\n", "has no rows"),
        (b'{"text": "a", "n": 1}\n{"text": "b"}\n', "no usable prompt column: the first 2 rows has text, n"),
        (b"{nope\n", "none of the first 1 rows is a JSON object"),
        (b'{"prompt": 5}\n', "none of the first 1 rows has a usable prompt"),
    ],
)
def test_unusable_input_fails_at_once(gen, tmp_path, content, needle):
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(content)
    code, err = gen(inp, tmp_path / "out.jsonl")
    assert code == 1 and needle in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out.jsonl").exists()


def test_parquet_without_prompt_column_names_the_schema(gen, tmp_path):
    inp = write_parquet(tmp_path / "in.parquet", [{"question": "q", "qid": 1}])
    code, err = gen(inp, tmp_path / "out.jsonl")
    assert code == 1 and "the Parquet schema has question, qid" in err
    code, err = gen(inp, tmp_path / "out.jsonl", "--template", "{question} {answer}")
    assert code == 1 and "answer" in err


@pytest.mark.parametrize(
    ("inp", "out", "needle"),
    [
        ("missing.jsonl", "out.jsonl", "does not exist"),
        ("in.csv", "out.jsonl", "unknown input format"),
        ("in.jsonl", "out.txt", "unknown output format"),
    ],
)
def test_usage_errors_exit_2(gen, tmp_path, inp, out, needle):
    (tmp_path / "in.csv").write_text("prompt\nhello\n")
    write_jsonl(tmp_path / "in.jsonl", ROWS)
    code, err = gen(tmp_path / inp, tmp_path / out)
    assert code == 2 and needle in err


@pytest.mark.parametrize(
    "args",
    [
        ["--prompt-column", "p", "--template", "{x}"],
        ["--keep-columns", "index"],
        ["--temperature", "-1"],
        ["--block-size", "3"],
        ["--n", "0"],
    ],
)
def test_bad_options_exit_2(gen, tmp_path, args):
    inp = write_jsonl(tmp_path / "in.jsonl", ROWS)
    assert gen(inp, tmp_path / "out.jsonl", *args)[0] == 2


# -- formats, templates, ids, kept columns ---------------------------------------------------------------
QUESTIONS = [{"qid": f"q{i}", "question": f"What is {i} plus {i}?", "level": i % 3} for i in range(6)]


@pytest.mark.parametrize(("src", "dst"), [("parquet", "parquet"), ("jsonl", "parquet"), ("parquet", "jsonl")])
def test_formats_with_template_ids_and_kept_columns(gen, tmp_path, src, dst):
    writer = write_parquet if src == "parquet" else write_jsonl
    inp = writer(tmp_path / f"in.{src}", QUESTIONS)
    args = ["--template", r"Q: {question}\nA:", "--id-column", "qid", "--keep-columns", "level,question"]
    out = tmp_path / f"out.{dst}"
    code, err = gen(inp, out, *args)
    assert code == 0, err
    records = by_index(read_records(out))
    assert [(r["id"], r["index"], r["level"], r["question"]) for r in records] == [
        (q["qid"], i, q["level"], q["question"]) for i, q in enumerate(QUESTIONS)
    ]
    # the same rows through JSONL -> JSONL give the same completions: format does not change results
    ref_out = tmp_path / "ref.jsonl"
    assert gen(write_jsonl(tmp_path / "ref_in.jsonl", QUESTIONS), ref_out, *args)[0] == 0
    assert [r["completion"] for r in records] == [r["completion"] for r in by_index(read_records(ref_out))]
    if dst == "parquet":
        assert "error" in pq.read_schema(out).names  # a fixed schema: null when there is no error


def test_parquet_directory_input(gen, tmp_path):
    d = tmp_path / "ds"
    d.mkdir()
    write_parquet(d / "a.parquet", QUESTIONS[:3])
    write_parquet(d / "b.parquet", QUESTIONS[3:])
    code, err = gen(d, tmp_path / "out.jsonl", "--template", "{question}", "--id-column", "qid")
    assert code == 0, err
    assert [(r["index"], r["id"]) for r in by_index(read_records(tmp_path / "out.jsonl"))] == [
        (i, q["qid"]) for i, q in enumerate(QUESTIONS)
    ]


def test_samples_tokens_logprobs_and_chat_options(gen, tmp_path):
    rows = [{"prompt": "Same prompt"}, {"prompt": "Same prompt"}]
    inp, out = write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "out.jsonl"
    code, err = gen(
        inp, out, "--n", "2", "--temperature", "1.0", "--return-tokens", "--logprobs", "--seed", "3"
    )
    assert code == 0, err
    recs = by_index(read_records(out))
    assert [(r["index"], r["sample"]) for r in recs] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for r in recs:
        assert len(r["token_ids"]) == len(r["logprobs"]) == r["completion_tokens"]
        assert all(lp <= 0 for lp in r["logprobs"])
    assert len({tuple(r["token_ids"]) for r in recs}) > 1  # rows with the same prompt differ
    raw = tmp_path / "raw.jsonl"
    assert gen(inp, raw, "--no-chat")[0] == 0
    system = tmp_path / "sys.jsonl"
    assert gen(inp, system, "--system-prompt", "You answer every question " * 20)[0] == 0
    chat_tokens = read_records(out)[0]["prompt_tokens"]
    assert read_records(raw)[0]["prompt_tokens"] < chat_tokens < read_records(system)[0]["prompt_tokens"]


def test_per_row_overrides(gen, tmp_path):
    rows = [
        {"prompt": "One", "max_new_tokens": 1},
        {"prompt": "Two", "max_new_tokens": 3, "temperature": 0.9},
    ]
    inp, out = write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "out.jsonl"
    assert gen(inp, out, "--ignore-eos", max_new_tokens=8)[0] == 0
    assert [r["completion_tokens"] for r in by_index(read_records(out))] == [1, 3]


def test_status_command(gen, tmp_path):
    inp, out = write_jsonl(tmp_path / "in.jsonl", ROWS), tmp_path / "out.jsonl"
    assert gen(inp, out, "--limit", "3")[0] == 0
    result = CliRunner().invoke(cli, ["status", str(out)])
    assert result.exit_code == 0 and "complete" in result.output and "3/3 rows" in result.output
    data = json.loads(CliRunner().invoke(cli, ["status", str(out), "--json"]).output)
    assert data["totals"]["rows_done"] == 3 and data["runs"][0]["complete"]
    missing = CliRunner().invoke(cli, ["status", str(tmp_path / "nope.jsonl")])
    assert missing.exit_code == 1 and "no batchgen run" in missing.stderr


def test_status_sums_shards(gen, tmp_path):
    inp = write_jsonl(tmp_path / "in.jsonl", ROWS)
    for i in range(2):
        assert gen(inp, tmp_path / f"out.shard-{i:05d}-of-00002.jsonl", "--limit", str(i + 1))[0] == 0
    result = CliRunner().invoke(cli, ["status", str(tmp_path / "out.jsonl")])
    assert result.exit_code == 0 and "all 2 shards: 3/3 rows" in result.output


def test_stop_string_is_excluded_from_the_completion(gen, tmp_path):
    inp = write_jsonl(tmp_path / "in.jsonl", [ROWS[0]])
    free = tmp_path / "free.jsonl"
    assert gen(inp, free, "--ignore-eos", max_new_tokens=12)[0] == 0
    text = read_records(free)[0]["completion"]
    stop = text[len(text) // 2 :][:3]  # greedy decoding repeats itself: cut it at a string from its middle
    stopped = tmp_path / "stopped.jsonl"
    assert gen(inp, stopped, "--ignore-eos", "--stop", stop, max_new_tokens=12)[0] == 0
    record = read_records(stopped)[0]
    assert record["finish_reason"] == "stop" and record["completion"] == text[: text.find(stop)]
