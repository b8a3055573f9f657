"""``--chat-template`` and ``--chat-template-kwargs``: read and checked before the model loads (a bad one
is a usage error, exit 2), and what of them a resume must find unchanged."""

from __future__ import annotations

import hashlib
from typing import Any

from batchgen.io.chat_inputs import template_kwargs

_TEMPLATE_MARKS = ("{{", "{%")  # text with these is a template, not a path (as vLLM decides)


def read_chat_template(value: str | None) -> str | None:
    """--chat-template FILE: the Jinja file's text; as in vLLM, the template text itself is taken too.
    ValueError names the problem (a missing file, a syntax error and its line)."""
    if value is None:
        return None
    try:
        with open(value, encoding="utf-8-sig") as file:
            text, source = file.read(), value
    except UnicodeDecodeError:
        raise ValueError(f"--chat-template {value}: not UTF-8 text") from None
    except OSError as exc:
        if not any(mark in value for mark in _TEMPLATE_MARKS):
            raise ValueError(f"--chat-template {value}: {exc.strerror or exc}") from None
        text, source = value, "(the template text given)"
    _check_syntax(text, source)
    return text


def _check_syntax(text: str, source: str) -> None:
    from jinja2 import TemplateSyntaxError

    from batchgen.model.files.chat_template import compile_template

    try:
        compile_template(text)
    except TemplateSyntaxError as exc:
        raise ValueError(f"--chat-template {source}: line {exc.lineno}: {exc.message}") from None


def chat_template_kwargs(text: str | None) -> dict[str, Any] | None:
    """--chat-template-kwargs JSON: a JSON object of template variables (None when not given)."""
    if text is None:
        return None
    return template_kwargs(text, "--chat-template-kwargs") or None


def template_fingerprint(chat_template: str | None, kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """The keys a resume compares, only those set: states written before these options stay equal."""
    out: dict[str, Any] = {}
    if chat_template is not None:
        out["chat_template"] = "sha256:" + hashlib.sha256(chat_template.encode()).hexdigest()[:16]
    if kwargs:
        out["chat_template_kwargs"] = kwargs
    return out
