import pytest

from batchgen.io import row_parser
from batchgen.io.row_parser import (
    ParsedRow,
    RowError,
    RowSpec,
    SchemaError,
    UnknownKey,
    parse_overrides,
    template_fields,
    unescape_template,
)

CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


def test_unescape_template_understands_shell_escapes():
    assert unescape_template(r"Q: {q}\nA:\t\\n") == "Q: {q}\nA:\t\\n"
    assert unescape_template("plain é {x}") == "plain é {x}"


def test_template_fields_are_top_level_columns():
    assert template_fields("{a} {b.c} {d[0]} {a}") == ["a", "b", "d"]
    with pytest.raises(ValueError):
        template_fields("{}")


def test_messages_preferred_over_prompt_and_index_is_default_id():
    row = RowSpec().parse(7, {"prompt": "p", "messages": CHAT})
    assert row == ParsedRow(7, 7, CHAT, {}, {})


def test_prompt_used_when_messages_null_and_id_column_default():
    row = RowSpec().parse(0, {"id": "x1", "prompt": "hello", "messages": None})
    assert isinstance(row, ParsedRow) and row.prompt == "hello" and row.id == "x1"


def test_prompt_column_and_explicit_id_column():
    spec = RowSpec(prompt_column="text", id_column="uid")
    assert spec.parse(3, {"text": "t", "uid": 9, "prompt": "ignored"}).prompt == "t"
    bad = spec.parse(3, {"text": "t"})
    assert isinstance(bad, RowError) and "uid" in bad.error


def test_template_builds_prompt_and_reports_missing_fields():
    spec = RowSpec(template="Q: {question}\nA:")
    assert spec.parse(0, {"question": "why?"}).prompt == "Q: why?\nA:"
    for row in ({"other": 1}, {"question": None}):
        err = spec.parse(0, row)
        assert isinstance(err, RowError) and "question" in err.error


def test_kept_columns_copied_even_for_bad_rows():
    spec = RowSpec(keep_columns=("a", "b"))
    assert spec.parse(0, {"prompt": "p", "a": 1}).kept == {"a": 1, "b": None}
    assert spec.parse(0, {"a": 2}).kept == {"a": 2, "b": None}


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        ({"foo": 1}, "no prompt"),
        ({"prompt": 12}, "must be a string"),
        ({"messages": []}, "empty message list"),
        ({"messages": [{"content": "x"}]}, "role"),
        ({"messages": [{"role": "user", "content": 5}]}, "content"),
        ({"prompt": "p", "max_new_tokens": "ten"}, "max_new_tokens must be an integer"),
        ({"prompt": "p", "temperature": "hot"}, "temperature must be a number"),
        ({"prompt": "p", "stop": 3}, "stop must be"),
    ],
)
def test_bad_rows_are_errors_naming_the_problem(row, needle):
    err = RowSpec().parse(4, row)
    assert isinstance(err, RowError) and needle in err.error and err.index == 4


def test_non_object_row_is_an_error():
    err = RowSpec().parse(1, [1, 2])
    assert isinstance(err, RowError) and "not an object" in err.error


def test_overrides_parse_and_normalise():
    ov = parse_overrides(
        {
            "max_new_tokens": 5.0,
            "temperature": 1,
            "top_p": float("nan"),
            "top_k": None,
            "seed": 3,
            "stop": "x",
        }
    )
    assert ov == {"max_new_tokens": 5, "temperature": 1.0, "seed": 3, "stop": ("x",)}
    assert parse_overrides({"stop": ["a", "b"]}) == {"stop": ("a", "b")}
    with pytest.raises(ValueError):
        parse_overrides({"max_new_tokens": True})


def test_spec_validation():
    with pytest.raises(ValueError, match="exclude"):
        RowSpec(prompt_column="a", template="{b}")
    with pytest.raises(ValueError, match="index"):
        RowSpec(keep_columns=("index",))


def test_check_columns_names_what_was_found():
    with pytest.raises(SchemaError, match="has a, b"):
        RowSpec().check_columns(["a", "b"], "the Parquet schema")
    with pytest.raises(SchemaError, match="question"):
        RowSpec(template="{question}").check_columns(["q"], "x")
    with pytest.raises(SchemaError, match="'txt'"):
        RowSpec(prompt_column="txt").check_columns(["prompt"], "x")
    RowSpec().check_columns(["messages"], "x")


def test_needed_columns_projects_only_what_is_used():
    cols = ["id", "prompt", "messages", "big_blob", "seed", "keep"]
    assert RowSpec(keep_columns=("keep",)).needed_columns(cols) == [
        "id",
        "prompt",
        "messages",
        "seed",
        "keep",
    ]
    assert RowSpec(template="{big_blob}").needed_columns(cols) == ["id", "big_blob", "seed"]


SHAREGPT = [
    {"from": "system", "value": "be brief"},
    {"from": "human", "value": "hi"},
    {"from": "gpt", "value": "hello", "weight": 0},
    {"from": "human", "value": "again"},
]
SHAREGPT_AS_MESSAGES = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "hello"},
    {"role": "user", "content": "again"},
]


def test_sharegpt_conversations_are_read_as_messages():
    assert RowSpec().parse(0, {"conversations": SHAREGPT}).prompt == SHAREGPT_AS_MESSAGES
    spoken = [{"from": "user", "value": "hi"}, {"from": "assistant", "value": "hello"}]
    assert RowSpec().parse(0, {"conversations": spoken}).prompt == SHAREGPT_AS_MESSAGES[1:3]
    # messages are preferred, and a --prompt-column may hold ShareGPT turns too
    assert RowSpec().parse(0, {"messages": CHAT, "conversations": SHAREGPT}).prompt == CHAT
    assert RowSpec(prompt_column="turns").parse(0, {"turns": SHAREGPT}).prompt == SHAREGPT_AS_MESSAGES
    # Parquet fills a struct's missing fields with nulls: a turn with from/value and a null role
    parquet_turn = {"role": None, "content": None, "from": "human", "value": "hi"}
    assert RowSpec().parse(0, {"conversations": [parquet_turn]}).prompt == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("row", "error"),
    [
        (
            {"messages": [{"role": "user", "content": "a"}, {"role": "bot", "content": "b"}]},
            "unknown role 'bot' in messages[1]: expected system, developer, user, assistant, tool "
            "(or ShareGPT's human, gpt, system)",
        ),
        (
            {"conversations": [{"from": "human", "value": "a"}, {"from": "narrator", "value": "b"}]},
            "unknown role 'narrator' in conversations[1]: expected system, developer, user, assistant, tool "
            "(or ShareGPT's human, gpt, system)",
        ),
        ({"conversations": [{"from": "human", "value": 3}]}, "conversations[0]: a ShareGPT turn's 'value'"),
        ({"conversations": 5}, "column 'conversations' must be a string or a list of messages, not int"),
        ({"conversations": ["hi"]}, "conversations[0] must be an object with a string 'role', not a string"),
        ({"prompt": "p", "chat_template_kwargs": [1]}, "must be a JSON object, not an array"),
        ({"prompt": "p", "chat_template_kwargs": "{oops"}, "column 'chat_template_kwargs' is not valid JSON"),
        ({"prompt": "p", "chat_template_kwargs": {"tokenize": True}}, "cannot set 'tokenize'"),
        ({"prompt": "p", "tools": {"type": "function"}}, "column 'tools' must be a list of tool objects"),
        ({"prompt": "p", "tools": ["get_weather"]}, "column 'tools': item 0 must be a tool object"),
    ],
)
def test_bad_chat_inputs_are_row_errors_naming_the_problem(row, error):
    err = RowSpec().parse(2, row)
    assert isinstance(err, RowError) and error in err.error


def test_a_tool_call_message_may_have_no_content():
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "type": "function"}]}
    assert RowSpec().parse(0, {"messages": [call]}).prompt == [{k: v for k, v in call.items() if v}]
    err = RowSpec().parse(0, {"messages": [{"role": "assistant", "content": None}]})
    assert isinstance(err, RowError) and "content" in err.error


def test_a_rows_template_variables_and_tools_are_data():
    tool = {"type": "function", "function": {"name": "f"}}
    row = {"prompt": "p", "chat_template_kwargs": {"enable_thinking": False, "unset": None}, "tools": [tool]}
    parsed = RowSpec().parse(0, row)
    assert parsed.chat_template_kwargs == {"enable_thinking": False} and parsed.tools == [tool]
    assert parsed.overrides == {}
    as_text = RowSpec().parse(0, {"prompt": "p", "chat_template_kwargs": '{"a": 1}', "tools": "[]"})
    assert as_text.chat_template_kwargs == {"a": 1} and as_text.tools == []
    plain = RowSpec().parse(0, {"prompt": "p", "chat_template_kwargs": {}})
    assert plain.chat_template_kwargs is None and plain.tools is None


def test_chat_columns_are_never_taken_for_sampling_keys(monkeypatch):
    """Even were a sampling parameter ever named like them (every other key refused here)."""
    monkeypatch.setattr(row_parser, "key_problem", lambda key: f"looks like a sampling key: {key}")
    spec = RowSpec()
    spec.check_keys(["prompt", "messages", "conversations", "chat_template_kwargs", "tools"], "row 0")
    with pytest.raises(UnknownKey, match="row 0: looks like a sampling key: other"):
        spec.check_keys(["conversations", "other"], "row 0")
    parsed = spec.parse(0, {"conversations": [{"from": "human", "value": "hi"}], "tools": []})
    assert isinstance(parsed, ParsedRow) and parsed.tools == []


def test_conversations_is_a_prompt_column_and_projected():
    RowSpec().check_columns(["id", "conversations"], "the Parquet schema")
    with pytest.raises(SchemaError, match="expected 'messages', 'conversations' or 'prompt'"):
        RowSpec().check_columns(["id", "text"], "the Parquet schema")
    cols = ["id", "conversations", "blob", "chat_template_kwargs", "tools"]
    assert RowSpec().needed_columns(cols) == ["id", "conversations", "chat_template_kwargs", "tools"]
    assert RowSpec(template="{blob}").needed_columns(cols) == ["id", "blob", "chat_template_kwargs", "tools"]
