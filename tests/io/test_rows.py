import pytest

from batchgen.io.rows import (
    ParsedRow,
    RowError,
    RowSpec,
    SchemaError,
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
