"""OpenAI Batch requests -> rows (io/openai_batch.py), and records -> response lines (io/openai_output.py)."""

import orjson
import pytest

from batchgen.io.openai_batch import BatchRequests, is_batch_request
from batchgen.io.openai_output import BatchJob, line_order, response_line, write_responses
from batchgen.io.row_parser import ParsedRow, RowError

CHAT, TEXT = "/v1/chat/completions", "/v1/completions"
JOB = BatchJob("some-model", 1700000000)


def _request(body: dict, url: str = CHAT, custom_id: str = "a") -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def _parse(line) -> ParsedRow | RowError:
    return BatchRequests().parse(7, line)


def test_a_chat_request_is_its_messages_with_the_body_sampling_fields():
    body = {"model": "gpt-x", "messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": 9,
            "temperature": 0.5, "n": 2, "seed": 3, "stop": ["\n"], "min_p": 0.1, "logit_bias": {"5": -100},
            "chat_template_kwargs": {"enable_thinking": False}}  # fmt: skip
    row = _parse(_request(body))
    assert isinstance(row, ParsedRow)
    assert (row.index, row.id, row.chat, row.kept) == (7, "a", None, {"url": CHAT})
    assert row.prompt == [{"role": "user", "content": "Hi"}]
    assert row.overrides == {"max_new_tokens": 9, "temperature": 0.5, "n": 2, "seed": 3, "stop": ("\n",),
                             "min_p": 0.1, "logit_bias": ((5, -100.0),)}  # fmt: skip
    assert row.chat_template_kwargs == {"enable_thinking": False}


def test_a_completions_request_is_its_prompt_sent_raw():
    row = _parse(_request({"prompt": "Once", "max_tokens": 4, "logprobs": 2}, TEXT))
    assert (row.prompt, row.chat, row.overrides) == ("Once", False, {"max_new_tokens": 4, "logprobs": 2})
    assert _parse(_request({"prompt": ["Once"]}, TEXT)).prompt == "Once"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"logprobs": True}, 0),
        ({"logprobs": True, "top_logprobs": 3}, 3),
        ({"logprobs": False}, None),
    ],
)
def test_chat_logprobs_and_top_logprobs_are_one_count(body, expected):
    row = _parse(_request({"messages": [{"role": "user", "content": "x"}], **body}))
    assert row.overrides.get("logprobs") == expected


def test_response_format_json_schema_and_json_object_constrain_the_output():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}
    row = _parse(_request({"messages": [{"role": "user", "content": "x"}], "response_format": fmt}))
    assert orjson.loads(row.overrides["json_schema"]) == schema
    row = _parse(
        _request({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}})
    )
    assert orjson.loads(row.overrides["json_schema"]) == {"type": "object"}


@pytest.mark.parametrize(
    ("line", "error"),
    [
        (_request({"input": "x"}, "/v1/embeddings"), "url '/v1/embeddings' is not served"),
        (_request({"prompt": "x"}), "a chat completions request needs 'messages'"),
        (
            _request({"messages": [{"role": "user", "content": "x"}], "temprature": 1}),
            "did you mean 'temperature'",
        ),
        (
            _request({"messages": [{"role": "user", "content": "x"}], "frobnicate": 1}),
            "'frobnicate' is not served",
        ),
        (_request({"messages": [{"role": "bot", "content": "x"}]}), "unknown role 'bot'"),
        (
            _request({"messages": [{"role": "user", "content": "x"}], "stream": True}),
            "'stream' is not served",
        ),
        (_request({"prompt": [1, 2]}, TEXT), "'prompt' must be one string"),
        (_request({"messages": [{"role": "user", "content": "x"}], "max_tokens": "many"}), "max_new_tokens"),
        ({"method": "POST", "url": CHAT, "body": {}}, "no custom_id"),
        ({**_request({}), "method": "GET"}, "only POST"),
        ({**_request({}), "body": "text"}, "body must be an object"),
    ],
)
def test_a_request_that_cannot_be_served_is_a_row_error_naming_why(line, error):
    row = _parse(line)
    assert isinstance(row, RowError), row
    assert error in row.error
    assert row.id == line.get("custom_id")


def test_only_lines_with_custom_id_url_and_body_are_requests():
    assert is_batch_request(_request({}))
    assert not is_batch_request({"custom_id": "a", "prompt": "x"})
    assert not is_batch_request([1])


# -- response lines ----------------------------------------------------------------------------------------
def _record(sample: int, **extra) -> dict:
    record = {"id": "a", "index": 4, "sample": sample, "completion": f"text{sample}", "finish_reason": "stop",
              "prompt_tokens": 11, "completion_tokens": 3 + sample, "url": CHAT}  # fmt: skip
    return record | extra


def test_a_chat_response_holds_every_choice_and_the_summed_usage():
    line = response_line([_record(0), _record(1, finish_reason="length")], JOB)
    assert (line["id"], line["custom_id"], line["error"]) == ("batch_req_4", "a", None)
    response = line["response"]
    assert (response["status_code"], response["request_id"]) == (200, "req_4")
    body = response["body"]
    assert (body["object"], body["model"], body["created"]) == ("chat.completion", "some-model", 1700000000)
    assert [c["message"]["content"] for c in body["choices"]] == ["text0", "text1"]
    assert [c["finish_reason"] for c in body["choices"]] == ["stop", "length"]
    assert body["usage"] == {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
    assert line_order(line) == (4, 0)


def test_logprobs_take_each_endpoints_shape():
    tops = [
        [{"token_id": 1, "token": "Hi", "logprob": -0.5}],
        [{"token_id": 2, "token": "?", "logprob": -0.9}],
    ]
    lp = {"logprobs": [-0.5, -1.0], "tokens": ["Hi", "!"], "top_logprobs": tops}
    chat = response_line([_record(0, **lp)], JOB)["response"]["body"]["choices"][0]["logprobs"]
    first = chat["content"][0]
    assert first == {"token": "Hi", "logprob": -0.5, "bytes": [72, 105],
                     "top_logprobs": [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105]}]}  # fmt: skip
    text = response_line([_record(0, url=TEXT, **lp)], JOB)["response"]["body"]
    assert text["object"] == "text_completion"
    assert text["choices"][0]["logprobs"] == {
        "tokens": ["Hi", "!"], "token_logprobs": [-0.5, -1.0], "top_logprobs": [{"Hi": -0.5}, {"?": -0.9}],
        "text_offset": [0, 2],
    }  # fmt: skip


def test_a_refused_request_gets_a_400_and_a_failure_while_generating_a_500():
    refused = response_line([_record(0, finish_reason="error", error="bad url", rejected=True)], JOB)
    assert refused["response"]["status_code"] == 400
    assert refused["error"] == {"code": "invalid_request", "message": "bad url"}
    assert refused["response"]["body"]["error"]["message"] == "bad url"
    failed = response_line([_record(0), _record(1, finish_reason="error", error="engine error")], JOB)
    assert failed["response"]["status_code"] == 500
    assert failed["error"]["code"] == "server_error"


def test_a_line_that_was_no_request_has_no_response():
    line = response_line(
        [_record(0, id=4, finish_reason="error", error="malformed JSON", rejected=True)], JOB
    )
    assert line == {"id": "batch_req_4", "custom_id": None, "response": None,
                    "error": {"code": "invalid_request", "message": "malformed JSON"}}  # fmt: skip


def test_responses_are_written_by_row_whatever_order_the_records_came_in(tmp_path):
    records = [_record(1, index=2), _record(0, index=0), _record(0, index=2), _record(0, index=1)]
    src = tmp_path / "records.jsonl"
    src.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    out = tmp_path / "out.jsonl"
    write_responses(str(src), str(out), JOB)
    lines = [orjson.loads(x) for x in out.read_bytes().splitlines()]
    assert [x["id"] for x in lines] == ["batch_req_0", "batch_req_1", "batch_req_2"]
    assert [c["index"] for c in lines[2]["response"]["body"]["choices"]] == [0, 1]
    assert not (tmp_path / "out.jsonl.writing").exists()


def test_openais_developer_role_is_a_system_message():
    row = _parse(
        _request(
            {"messages": [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "x"}]}
        )
    )
    assert [m["role"] for m in row.prompt] == ["system", "user"]
