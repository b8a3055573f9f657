"""End to end through ``batchgen run`` on a tiny model: chat data sets (ShareGPT ``conversations``, unknown
roles, a byte-order mark, stdin) and chat template control (``--chat-template``, ``--chat-template-kwargs``,
a row's ``chat_template_kwargs`` and ``tools``)."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import threading

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from transformers import AutoTokenizer

from batchgen.app.stdin_input import check_dashes
from batchgen.cli import cli
from tests.support.chat_template_cases import THINK_TEMPLATE, WEATHER_TOOL, rendered
from tests.support.models import build_tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CHATS = [
    [{"role": "user", "content": "Name a colour."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why is the sea salty?"}],
    [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Count to three."},
    ],
]
_SHAREGPT_FROM = {"user": "human", "assistant": "gpt", "system": "system"}
UNKNOWN_ROLE = (
    "unknown role 'bot' in messages[1]: expected system, developer, user, assistant, tool "
    "(or ShareGPT's human, gpt, system)"
)


def as_sharegpt(chat: list[dict]) -> list[dict]:
    return [{"from": _SHAREGPT_FROM[m["role"]], "value": m["content"]} for m in chat]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return str(build_tiny_model("llama", tmp_path_factory.mktemp("chat-inputs") / "llama"))


@pytest.fixture(scope="module")
def tokenizer(model):
    return AutoTokenizer.from_pretrained(model)


@pytest.fixture
def run(model):
    """``batchgen run`` in this process: (exit code, stderr)."""

    def _run(*args, stdin: bytes | None = None):
        argv = ["run", *map(str, args), "--model", model, "--max-num-seqs", "4", "--max-new-tokens", "4"]
        result = CliRunner().invoke(cli, argv, input=stdin, catch_exceptions=False)
        return result.exit_code, result.stderr

    return _run


def jsonl(rows: list[dict]) -> bytes:
    return b"".join(orjson.dumps(row) + b"\n" for row in rows)


def records(path) -> dict:
    return {r["id"]: r for r in map(orjson.loads, path.read_bytes().splitlines())}


def generated(recs: dict) -> dict:
    return {i: (r["completion"], r["prompt_tokens"], r["completion_tokens"]) for i, r in recs.items()}


def test_sharegpt_rows_give_what_the_same_messages_give(run, tmp_path):
    as_messages = [{"id": i, "messages": chat} for i, chat in enumerate(CHATS)]
    as_conversations = [{"id": i, "conversations": as_sharegpt(chat)} for i, chat in enumerate(CHATS)]
    (tmp_path / "m.jsonl").write_bytes(jsonl(as_messages))
    (tmp_path / "s.jsonl").write_bytes(jsonl(as_conversations))
    assert run(tmp_path / "m.jsonl", tmp_path / "m.out.jsonl")[0] == 0
    code, err = run(tmp_path / "s.jsonl", tmp_path / "s.out.jsonl")
    assert code == 0, err
    want = records(tmp_path / "m.out.jsonl")
    assert sorted(want) == [0, 1, 2] and all(r["finish_reason"] != "error" for r in want.values())
    assert generated(records(tmp_path / "s.out.jsonl")) == generated(want)


def test_parquet_conversations_and_template_inputs_are_read(run, tokenizer, tmp_path):
    """Projection reads ShareGPT turns, a struct of template variables (nulls where a row lacks a key)
    and the tools; other columns are never decoded."""
    chat = CHATS[0]
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"city": "string"}}}
    rows = [
        {"id": "on", "conversations": as_sharegpt(chat), "chat_template_kwargs": {"enable_thinking": True},
         "tools": None, "blob": "x"},
        {"id": "tools", "conversations": as_sharegpt(chat), "chat_template_kwargs": None,
         "tools": [tool], "blob": "y"},
        {"id": "other", "conversations": as_sharegpt(chat), "chat_template_kwargs": {"style": "terse"},
         "tools": None, "blob": "z"},
    ]  # fmt: skip
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in.parquet")
    code, err = run(tmp_path / "in.parquet", tmp_path / "out.jsonl", "--chat-template", THINK_TEMPLATE)
    assert code == 0, err

    def tokens(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    got = {i: r["prompt_tokens"] for i, r in records(tmp_path / "out.jsonl").items()}
    assert got == {
        "on": tokens(rendered(chat, True)),
        "tools": tokens(rendered(chat, False, tools="get_weather")),
        "other": tokens(rendered(chat, False)),
    }


def test_an_unknown_role_is_a_row_error_naming_it(run, tmp_path):
    bad = [{"role": "user", "content": "Hi"}, {"role": "bot", "content": "Hello"}]
    rows = [{"id": "ok", "messages": CHATS[0]}, {"id": "bad", "messages": bad}]
    (tmp_path / "in.jsonl").write_bytes(jsonl(rows))
    code, err = run(tmp_path / "in.jsonl", tmp_path / "out.jsonl")
    assert code == 0, err
    recs = records(tmp_path / "out.jsonl")
    assert recs["bad"]["finish_reason"] == "error" and recs["bad"]["error"] == UNKNOWN_ROLE
    assert recs["ok"]["finish_reason"] in ("stop", "length") and recs["ok"]["completion_tokens"] > 0


def test_template_file_flag_kwargs_row_kwargs_and_tools_reach_the_template(run, tokenizer, tmp_path):
    chat = CHATS[0]
    rows = [
        {"id": "flag", "messages": chat},
        {"id": "row-off", "messages": chat, "chat_template_kwargs": {"enable_thinking": False}},
        {"id": "other-key", "messages": chat, "chat_template_kwargs": {"unused": 1}},
        {"id": "tools", "messages": chat, "tools": [WEATHER_TOOL]},
    ]
    (tmp_path / "in.jsonl").write_bytes(jsonl(rows))
    (tmp_path / "t.jinja").write_text(THINK_TEMPLATE)
    out = tmp_path / "out.jsonl"
    flags = ("--chat-template", tmp_path / "t.jinja", "--chat-template-kwargs", '{"enable_thinking": true}')
    code, err = run(tmp_path / "in.jsonl", out, *flags)
    assert code == 0, err

    def tokens(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    think, no_think = tokens(rendered(chat, True)), tokens(rendered(chat, False))
    with_tools = tokens(rendered(chat, True, tools="get_weather"))
    assert len({think, no_think, with_tools}) == 3  # each variable shows in the prompt's length
    got = {i: r["prompt_tokens"] for i, r in records(out).items()}
    assert got == {"flag": think, "row-off": no_think, "other-key": think, "tools": with_tools}
    # the template and its variables are part of what a resume checks
    code, err = run(
        tmp_path / "in.jsonl", out, *flags[:2], "--chat-template-kwargs", '{"enable_thinking": false}'
    )
    assert code == 1 and "prompts chat_template_kwargs enable_thinking: true -> false" in err
    code, err = run(tmp_path / "in.jsonl", out, *flags)
    assert code == 0 and "already complete" in err
    code, err = run(tmp_path / "in.jsonl", tmp_path / "plain.jsonl", *flags[:2])  # no flag: thinking off
    assert code == 0, err
    assert records(tmp_path / "plain.jsonl")["flag"]["prompt_tokens"] == no_think


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (
            ["--chat-template-kwargs", "{enable_thinking: false}"],
            "Error: --chat-template-kwargs is not valid JSON: Expecting property name enclosed in double "
            "quotes: line 1 column 2 (char 1)",
        ),
        (
            ["--chat-template-kwargs", "[1]"],
            "Error: --chat-template-kwargs must be a JSON object, not an array",
        ),
        (
            ["--chat-template-kwargs", '{"add_generation_prompt": false}'],
            "Error: --chat-template-kwargs cannot set 'add_generation_prompt': batchgen sets it",
        ),
        (
            ["--chat-template", "missing.jinja"],
            "Error: --chat-template missing.jinja: No such file or directory",
        ),
        (
            ["--chat-template", "{% for m in messages %}{{ m.content }}"],
            "Error: --chat-template (the template text given): line 1: Unexpected end of template. Jinja "
            "was looking for the following tags: 'endfor' or 'else'. The innermost block that needs to be "
            "closed is 'for'.",
        ),
    ],
)
def test_bad_template_options_are_usage_errors(run, tmp_path, flags, line):
    (tmp_path / "in.jsonl").write_bytes(jsonl([{"messages": CHATS[0]}]))
    code, err = run(tmp_path / "in.jsonl", tmp_path / "out.jsonl", *flags)
    assert code == 2 and err.strip().splitlines()[-1] == line
    assert not list(tmp_path.glob("out.jsonl*"))  # nothing written


def test_template_text_itself_is_taken_as_vllm_takes_it(run, tokenizer, tmp_path):
    (tmp_path / "in.jsonl").write_bytes(jsonl([{"id": 0, "messages": CHATS[0]}]))
    code, err = run(tmp_path / "in.jsonl", tmp_path / "out.jsonl", "--chat-template", THINK_TEMPLATE)
    assert code == 0, err
    want = len(tokenizer.encode(rendered(CHATS[0], False), add_special_tokens=False))
    assert records(tmp_path / "out.jsonl")[0]["prompt_tokens"] == want


def test_a_byte_order_mark_changes_nothing(run, tmp_path):
    rows = [{"id": i, "messages": chat} for i, chat in enumerate(CHATS)]
    (tmp_path / "plain.jsonl").write_bytes(jsonl(rows))
    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + jsonl(rows))
    assert run(tmp_path / "plain.jsonl", tmp_path / "plain.out.jsonl")[0] == 0
    code, err = run(tmp_path / "bom.jsonl", tmp_path / "bom.out.jsonl")
    assert code == 0, err
    got = records(tmp_path / "bom.out.jsonl")
    assert generated(got) == generated(records(tmp_path / "plain.out.jsonl")) and sorted(got) == [0, 1, 2]


def test_stdin_is_an_input_that_never_resumes(run, tmp_path):
    rows = [{"id": i, "messages": chat} for i, chat in enumerate(CHATS)]
    (tmp_path / "in.jsonl").write_bytes(jsonl(rows))
    assert run(tmp_path / "in.jsonl", tmp_path / "file.jsonl")[0] == 0
    out = tmp_path / "out.jsonl"
    code, err = run("-", out, stdin=b"\xef\xbb\xbf" + jsonl(rows))
    assert code == 0, err
    assert generated(records(out)) == generated(records(tmp_path / "file.jsonl"))
    before = out.read_bytes()
    code, err = run("-", out, stdin=jsonl(rows))
    assert code == 2 and err.strip().splitlines()[-1] == (
        f"Error: Invalid value for 'OUTPUT': {out} already exists, and input from stdin ('-') cannot be "
        "resumed: pass --overwrite to start afresh, or give another OUTPUT"
    )
    assert out.read_bytes() == before  # nothing lost
    code, err = run("-", out, "--overwrite", stdin=jsonl(rows[:2]))
    assert code == 0, err
    assert sorted(records(out)) == [0, 1]


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["in.jsonl", "-"],
            "Error: OUTPUT '-': the output must be a file, since it is written incrementally and resumed",
        ),
        (
            ["-", "out.jsonl", "--shard", "0/2"],
            "Error: INPUT '-' (stdin) cannot be split into shards: drop --shard (or a Slurm array task), or "
            "give a file",
        ),
    ],
)
def test_dashes_that_cannot_work_are_refused(run, tmp_path, monkeypatch, args, line):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.jsonl").write_bytes(jsonl([{"messages": CHATS[0]}]))
    code, err = run(*args, stdin=b"")
    assert code == 2 and err.strip().splitlines()[-1] == line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]  # nothing written


def test_stats_of_a_stdin_run_are_its_own(run, tmp_path):
    """A stdin run's total is unknown until the stream ends, and is then counted."""
    stats = tmp_path / "s.json"
    rows = [{"id": i, "messages": chat} for i, chat in enumerate(CHATS)]
    code, err = run("-", tmp_path / "out.jsonl", "--stats-file", stats, stdin=jsonl(rows))
    assert code == 0, err
    summary = json.loads(stats.read_text())
    assert summary["status"] == "complete" and summary["rows"] == 3


def test_a_stopped_stdin_run_says_how_to_redo_it_not_to_resume(model, tmp_path):
    """SIGTERM while the stream is still open: the rows done are saved, and the advice is --overwrite."""
    out = tmp_path / "out.jsonl"
    argv = [sys.executable, "-m", "batchgen", "run", "-", str(out), "--model", model, "--max-new-tokens", "2"]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watchdog = threading.Timer(120, proc.kill)  # a run stuck waiting fails the test instead of hanging it
    watchdog.start()
    rows = [{"id": i, "prompt": f"Say {i}."} for i in range(150)]  # more than the checks read first
    proc.stdin.write(jsonl(rows).decode())
    proc.stdin.flush()  # left open: the producer is still running
    lines = iter(proc.stderr.readline, "")
    assert any("engine ready" in line for line in lines)
    proc.send_signal(signal.SIGTERM)
    rest = list(lines)
    assert proc.wait(timeout=120) == 75 and rest, rest
    assert rest[-1].strip() == (
        "batchgen: saved; input from stdin cannot be resumed: re-run with --overwrite to redo it, "
        "or give a file (exit 75)"
    )
    proc.stdin.close()
    watchdog.cancel()


def test_stdin_from_a_terminal_is_refused(monkeypatch):
    """``batchgen run - OUT`` typed with nothing piped in would wait for rows typed by hand."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO()))
    check_dashes("-", "out.jsonl", None, 1)  # a pipe or a file
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    with pytest.raises(
        ValueError, match="^INPUT '-' reads JSONL from stdin, which is a terminal: pipe the rows in$"
    ):
        check_dashes("-", "out.jsonl", None, 1)
    check_dashes("in.jsonl", "out.jsonl", None, 1)  # stdin unused
