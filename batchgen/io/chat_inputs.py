"""A row's chat inputs, checked before they reach a chat template: its messages (OpenAI ``messages`` or
ShareGPT ``conversations`` turns, read as OpenAI messages), its ``chat_template_kwargs`` and its ``tools``.
Each check raises a ValueError naming the problem: a row error for a row's value, a usage error for a
flag's. An unknown role is refused here, so a template never sees one.
"""

from __future__ import annotations

import json
from typing import Any

Messages = list[dict[str, Any]]

# Every role a message may have, as the role the template sees (ShareGPT's names mapped to OpenAI's).
_ROLES = {
    "system": "system",
    "developer": "system",  # OpenAI's newer name for the system message
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
    "human": "user",
    "gpt": "assistant",
}
_EXPECTED_ROLES = "expected system, developer, user, assistant, tool (or ShareGPT's human, gpt, system)"
# apply_chat_template's own arguments: batchgen sets them, so template variables of these names would clash.
RESERVED_TEMPLATE_KWARGS = (
    "conversation", "messages", "tools", "chat_template", "add_generation_prompt", "tokenize",
    "return_dict", "continue_final_message", "padding", "truncation", "max_length", "return_tensors",
    "return_assistant_tokens_mask", "tokenizer_kwargs", "sanitize_control_tokens",
)  # fmt: skip
_JSON_KINDS = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
               float: "a number", type(None): "null"}  # fmt: skip


def json_kind(value: Any) -> str:
    """What ``value`` is, in JSON's words, for error messages ("an object", "a string")."""
    return _JSON_KINDS.get(type(value), f"a {type(value).__name__}")


def normalize_messages(value: Any, name: str = "messages") -> Messages:
    """OpenAI-style messages from a list of them or of ShareGPT turns (``{"from", "value"}``), each with
    a known role; None-valued keys are dropped (Parquet fills a struct's missing fields with nulls)."""
    if not isinstance(value, list):
        raise ValueError(f"column {name!r} must be a list of messages, not {json_kind(value)}")
    if not value:
        raise ValueError(f"column {name!r} is an empty message list")
    return [_message(turn, f"{name}[{i}]") for i, turn in enumerate(value)]


def _message(turn: Any, where: str) -> dict[str, Any]:
    if not isinstance(turn, dict):
        raise ValueError(f"{where} must be an object with a string 'role', not {json_kind(turn)}")
    if turn.get("role") is None and turn.get("from") is not None:
        return _sharegpt_turn(turn, where)
    message = {key: value for key, value in turn.items() if value is not None}
    message["role"] = _role(message.get("role"), "role", where)
    content = message.get("content")
    if not isinstance(content, (str, list)) and not (content is None and message.get("tool_calls")):
        raise ValueError(f"{where}: message content must be a string or a list of parts")
    return message


def _sharegpt_turn(turn: dict[str, Any], where: str) -> dict[str, Any]:
    """A ShareGPT turn as an OpenAI message (its other keys, e.g. a training ``weight``, are dropped)."""
    role = _role(turn["from"], "from", where)
    if not isinstance(turn.get("value"), str):
        raise ValueError(f"{where}: a ShareGPT turn's 'value' must be a string")
    return {"role": role, "content": turn["value"]}


def _role(role: Any, key: str, where: str) -> str:
    if not isinstance(role, str):
        raise ValueError(f"{where} must be an object with a string 'role' (or ShareGPT's 'from')")
    if role not in _ROLES:
        raise ValueError(f"unknown role {role!r} in {where}: {_EXPECTED_ROLES}")
    return _ROLES[role]


def _decoded(value: Any, where: str) -> Any:
    """A JSON string decoded (flags, and Parquet columns that hold JSON text); any other value as it is."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError as exc:
        raise ValueError(f"{where} is not valid JSON: {exc}") from None


def template_kwargs(value: Any, where: str = "column 'chat_template_kwargs'") -> dict[str, Any]:
    """Extra chat template variables: a JSON object (or its text); null values mean "not set"."""
    value = _decoded(value, where)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be a JSON object, not {json_kind(value)}")
    for key in value:
        if key in RESERVED_TEMPLATE_KWARGS:
            raise ValueError(f"{where} cannot set {key!r}: batchgen sets it")
    return {key: item for key, item in value.items() if item is not None}


def tool_list(value: Any, where: str = "column 'tools'") -> list[dict[str, Any]] | None:
    """OpenAI tool objects for the template's ``tools`` (a JSON array, or its text); None when not set."""
    value = _decoded(value, where)
    if value is None:
        return None
    if not isinstance(value, list):
        raise ValueError(f"{where} must be a list of tool objects, not {json_kind(value)}")
    for i, tool in enumerate(value):
        if not isinstance(tool, dict):
            raise ValueError(f"{where}: item {i} must be a tool object, not {json_kind(tool)}")
    return value
