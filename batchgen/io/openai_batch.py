"""OpenAI Batch input: a JSONL line ``{"custom_id", "method", "url", "body"}`` -> the row it asks for.

Two endpoints are served: ``/v1/chat/completions`` (the body's ``messages``, with the chat template) and
``/v1/completions`` (the body's ``prompt``, sent raw). Body fields named like a sampling parameter are the
row's overrides, as a row's keys are; OpenAI's own names map onto them (``max_completion_tokens``, chat's
``logprobs`` + ``top_logprobs``, ``response_format``). A request that cannot be served becomes a
``RowError`` naming the cause: it gets its own error line, and the rest of the file runs.
"""

from __future__ import annotations

import math
from typing import Any

import orjson

from batchgen.config import PARAM_NAMES, coerce
from batchgen.io.chat_inputs import json_kind, normalize_messages, template_kwargs, tool_list
from batchgen.io.param_keys import key_problem
from batchgen.io.row_parser import ParsedRow, RowError

CHAT_URL, COMPLETIONS_URL = "/v1/chat/completions", "/v1/completions"
ENDPOINTS = (CHAT_URL, COMPLETIONS_URL)
REQUEST_KEYS = ("custom_id", "method", "url", "body")
# Body fields OpenAI's clients send that change nothing here (``model``: the run's model answers).
_IGNORED = frozenset({"model", "user", "metadata", "store", "service_tier", "parallel_tool_calls"})
# Body fields with a meaning of their own (the rest must name a sampling parameter).
_OWN = frozenset({"messages", "prompt", "max_completion_tokens", "logprobs", "top_logprobs",
                  "response_format", "tools", "tool_choice", "chat_template_kwargs", "stream",
                  "stream_options", "echo", "suffix", "best_of"})  # fmt: skip


class RequestError(ValueError):
    """A request that cannot be served, as its error line says."""


def is_batch_request(row: Any) -> bool:
    """Whether a JSON line looks like an OpenAI Batch request (what ``--input-format auto`` checks)."""
    return isinstance(row, dict) and "custom_id" in row and "body" in row and "url" in row


class BatchRequests:
    """``RowSpec``'s counterpart for OpenAI Batch files: one request line -> a ParsedRow or a RowError.

    ``kept`` carries the request's ``url`` to the output records, from which ``openai_output`` builds
    the response lines."""

    keep_columns: tuple[str, ...] = ()

    def parse(self, index: int, line: Any) -> ParsedRow | RowError:
        custom_id = line.get("custom_id") if isinstance(line, dict) else None
        url = line.get("url") if isinstance(line, dict) else None
        kept = {"url": url if url in ENDPOINTS else None}
        try:
            body = _check_envelope(line)
            prompt, chat = _prompt(url, body)
            overrides = _overrides(url, body)
            kwargs = template_kwargs(body.get("chat_template_kwargs"))
            tools = tool_list(body.get("tools"))
        except ValueError as exc:  # RequestError, and the shared checks' own
            return RowError(index, custom_id, str(exc), kept)
        return ParsedRow(index, custom_id, prompt, overrides, kept, kwargs or None, tools, chat)


def _check_envelope(line: Any) -> dict[str, Any]:
    if not isinstance(line, dict):
        raise RequestError(f"a request must be a JSON object, not {json_kind(line)}")
    if not isinstance(line.get("custom_id"), str) or not line["custom_id"]:
        raise RequestError("the request has no custom_id (a non-empty string)")
    if line.get("method", "POST") != "POST":
        raise RequestError(f"method {line['method']!r} is not served: only POST")
    if line.get("url") not in ENDPOINTS:
        raise RequestError(f"url {line.get('url')!r} is not served: only {' and '.join(ENDPOINTS)}")
    if not isinstance(line.get("body"), dict):
        raise RequestError(f"the request's body must be an object, not {json_kind(line.get('body'))}")
    return line["body"]


def _prompt(url: str, body: dict[str, Any]) -> tuple[str | list[dict[str, Any]], bool | None]:
    """The prompt, and the chat mode it needs (completions' prompts are sent raw, as OpenAI's are)."""
    if url == CHAT_URL:
        if body.get("messages") is None:
            raise RequestError("a chat completions request needs 'messages'")
        return normalize_messages(body["messages"], "messages"), None
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        kind = json_kind(prompt)
        raise RequestError(
            f"a completions request's 'prompt' must be one string (one request a prompt), not {kind}"
        )
    return prompt, False


def _overrides(url: str, body: dict[str, Any]) -> dict[str, Any]:
    """The request's sampling parameters by field name, checked; RequestError names a field that is not
    served (unknown, a near miss, or a feature batchgen lacks)."""
    _refuse_unserved(url, body)
    out: dict[str, Any] = {}
    for key, value in body.items():
        if key in _IGNORED or key in _OWN or value is None or _nan(value):
            continue
        name = PARAM_NAMES.get(key)
        if name is None:
            raise RequestError(key_problem(key) or f"body field {key!r} is not served")
        _put(out, name, coerce(name, value), key)
    for name, value in _openai_fields(url, body).items():
        _put(out, name, coerce(name, value), name)
    return out


def _nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _put(out: dict[str, Any], name: str, value: Any, key: str) -> None:
    if name in out and out[name] != value:
        raise RequestError(f"{key} and {name} differ ({value!r} vs {out[name]!r}): give one")
    out[name] = value


def _refuse_unserved(url: str, body: dict[str, Any]) -> None:
    if body.get("stream"):
        raise RequestError("'stream' is not served in a batch: its response is written whole")
    if body.get("echo"):
        raise RequestError("'echo' is not served")
    if body.get("suffix") is not None:
        raise RequestError("'suffix' is not served")
    best_of = body.get("best_of")
    if best_of is not None and best_of != body.get("n", 1):
        raise RequestError("'best_of' other than n is not served")
    choice = body.get("tool_choice")
    if choice is not None and choice not in ("auto", "none"):
        raise RequestError("'tool_choice' other than auto or none is not served (tool calls are not parsed)")
    if url == COMPLETIONS_URL and ("top_logprobs" in body or "messages" in body):
        field = "top_logprobs" if "top_logprobs" in body else "messages"
        raise RequestError(f"body field {field!r} belongs to chat completions, not {COMPLETIONS_URL}")


def _openai_fields(url: str, body: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's names for what sampling parameters hold: max_completion_tokens, logprobs and
    top_logprobs, response_format."""
    out: dict[str, Any] = {}
    if body.get("max_completion_tokens") is not None:
        out["max_new_tokens"] = body["max_completion_tokens"]
    logprobs = _logprobs(url, body)
    if logprobs is not None:
        out["logprobs"] = logprobs
    schema = _response_schema(body.get("response_format"))
    if schema is not None:
        out["json_schema"] = schema
    return out


def _logprobs(url: str, body: dict[str, Any]) -> int | None:
    """Chat: ``logprobs`` true asks for the sampled tokens', ``top_logprobs`` N for N more each.
    Completions: ``logprobs`` N is both."""
    logprobs = body.get("logprobs")
    if url == COMPLETIONS_URL:
        return logprobs
    if logprobs is None or logprobs is False:
        if body.get("top_logprobs") is not None:
            raise RequestError("'top_logprobs' needs 'logprobs': true")
        return None
    if logprobs is not True:
        raise RequestError(f"chat 'logprobs' must be true or false, not {json_kind(logprobs)}")
    return body.get("top_logprobs") or 0


def _response_schema(fmt: Any) -> str | None:
    """``response_format``: text (none), json_object (any JSON object), json_schema (its ``schema``)."""
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return '{"type": "object"}'
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise RequestError("response_format json_schema needs a 'json_schema' object with a 'schema'")
        return orjson.dumps(schema).decode()
    raise RequestError(f"response_format type {kind!r} is not served: text, json_object or json_schema")
