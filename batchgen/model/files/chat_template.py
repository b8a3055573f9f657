"""Chat templates rendered as transformers renders them (``utils/chat_template_utils.py`` and
``PreTrainedTokenizerBase.apply_chat_template``), without importing transformers, as the verified releases
(``tokenizer.verified_transformers``) do. Where those releases differ, ``TemplateRules`` says which way the
installed one renders (``template_rules``).

The environment matches transformers' own: a sandboxed immutable jinja2 environment with
``trim_blocks``/``lstrip_blocks``, loop controls, a ``{% generation %}`` tag that renders its body,
``tojson`` without HTML escaping, and the globals ``raise_exception``, ``strftime_now``, ``dict`` and
``namespace`` (restricted from 5.22.2). The template sees the same variables: ``messages`` (None-valued keys
dropped from 5.23.0, reasoning fields aliased from 5.21.0), ``tools``, ``documents``,
``add_generation_prompt``, the special tokens and any extra keyword arguments. Inputs other than plain
JSON-like data raise on every release instead of rendering differently (5.22.2 converts them, older releases
pass them as they are).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any, NamedTuple

import jinja2
from jinja2 import nodes
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

Messages = list[dict[str, Any]]

# The names a message's reasoning may come under; templates read the first (transformers' order).
_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")
_PLAIN_SCALARS = (str, int, float, bool, type(None))
_MIN_JINJA = (3, 1, 6)  # transformers refuses older jinja2 (known sandbox escapes)
# apply_chat_template options of transformers that are not template variables and are not supported here.
UNSUPPORTED_OPTIONS = (
    "continue_final_message", "sanitize_control_tokens", "padding", "truncation", "max_length",
    "return_tensors", "return_assistant_tokens_mask", "tokenizer_kwargs",
)  # fmt: skip


class TemplateRules(NamedTuple):
    """How a transformers release renders chat templates, where the verified releases differ."""

    drop_none_keys: bool  # 5.23.0: None-valued message keys are dropped (before: passed as None)
    alias_reasoning: bool  # 5.21.0: reasoning is also passed as `thinking` and `reasoning_content`
    # 5.22.2: `namespace` refuses underscore-prefixed names and `dict` is a factory (call and fromkeys), not
    # the dict class; before, both are jinja2's/Python's own
    strict_sandbox: bool


def template_rules(release: tuple[int, int, int]) -> TemplateRules:
    """The rules of transformers release ``release`` (major, minor, patch), one of the verified ones."""
    return TemplateRules(
        drop_none_keys=release >= (5, 23, 0),
        alias_reasoning=release >= (5, 21, 0),
        strict_sandbox=release >= (5, 22, 2),
    )


class _GenerationTag(Extension):
    """``{% generation %}...{% endgeneration %}`` marks assistant text for transformers' assistant-token
    masks. batchgen never asks for masks, so, like transformers without a mask, it renders the body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("render_body"), [], [], body).set_lineno(lineno)

    def render_body(self, caller: Any) -> str:
        return caller()


def _refuse_private(name: Any) -> None:
    """Underscore names on a namespace could reach CPython internals: transformers refuses them too."""
    if isinstance(name, str) and name.startswith("_"):
        raise SecurityError(f"chat templates cannot set underscore-prefixed namespace attributes ({name!r})")


class _Namespace(Namespace):
    """jinja2's ``namespace`` that refuses underscore-prefixed names, at creation and on ``set``."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # jinja2's signature: `self` may be an attribute name
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _refuse_private(name)
        Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _refuse_private(name)
        Namespace.__setitem__(self, name, value)


class _DictFactory:
    """The template's ``dict``: builds plain dicts without exposing the ``dict`` class to the sandbox."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: Any = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    """transformers' ``tojson``: plain ``json.dumps`` (jinja2's escapes HTML characters)."""
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


@lru_cache(maxsize=2)
def _environment(strict_sandbox: bool) -> ImmutableSandboxedEnvironment:
    """One environment for every template (it holds no per-template state), per sandbox rule."""
    if _version(jinja2.__version__) < _MIN_JINJA:
        raise ImportError(f"chat templates need jinja2>=3.1.6 (installed: {jinja2.__version__})")
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals.update(
        raise_exception=_raise_exception,
        strftime_now=_strftime_now,
        dict=_DictFactory() if strict_sandbox else dict,
        namespace=_Namespace if strict_sandbox else Namespace,
    )
    return env


@lru_cache(maxsize=32)
def compile_template(text: str, strict_sandbox: bool = True) -> jinja2.Template:
    """The compiled template, cached by its text (a run renders one template for every prompt)."""
    return _environment(strict_sandbox).from_string(text)


def _plain(value: Any) -> Any:
    """A fresh copy of JSON-like data, as transformers rebuilds every template input; anything else
    (objects, subclasses, arrays) transformers would convert, so it is refused rather than guessed."""
    if type(value) in _PLAIN_SCALARS:
        return value
    if type(value) is dict:
        return {_plain(key): _plain(item) for key, item in value.items()}
    if type(value) is list:
        return [_plain(item) for item in value]
    if type(value) is tuple:
        return tuple(_plain(item) for item in value)
    raise TypeError(f"chat template inputs must be plain JSON-like data, got {type(value).__name__}")


def _with_reasoning_aliases(message: dict[str, Any]) -> dict[str, Any]:
    """Reasoning under any of its names is also passed as ``thinking`` and ``reasoning_content``, in
    transformers' key order (``thinking`` first unless already present, an existing key keeps its place)."""
    reasoning = next((message[key] for key in _REASONING_KEYS if message.get(key) is not None), None)
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


def prepare_messages(conversation: Sequence[Any], rules: TemplateRules) -> Messages:
    """The messages the template sees: copied, None-valued keys dropped and reasoning aliased as ``rules``
    say."""
    if not isinstance(conversation, (list, tuple)):
        raise TypeError("a conversation must be a list of message dicts")
    if not conversation:
        raise ValueError("Cannot apply chat template to an empty conversation. Provide at least one message.")
    if isinstance(conversation[0], (list, tuple)) or hasattr(conversation[0], "messages"):
        raise NotImplementedError("batches of conversations are not supported: render them one at a time")
    messages = []
    for message in conversation:
        if type(message) is not dict:
            raise TypeError(f"chat messages must be dicts, got {message!r}")
        if rules.drop_none_keys:
            message = {key: value for key, value in message.items() if value is not None}
        message = _plain(message)
        messages.append(_with_reasoning_aliases(message) if rules.alias_reasoning else message)
    return messages


def _checked_tools(tools: Any, documents: Any) -> tuple[Any, Any]:
    """Tools as JSON schemas (transformers also converts Python functions: not supported here)."""
    if tools is not None and not all(isinstance(tool, dict) for tool in tools):
        raise NotImplementedError("tools must be JSON schema dicts (function objects are not supported)")
    if documents is not None and not all(isinstance(doc, dict) for doc in documents):
        raise TypeError("Documents should be a list of dicts with 'title' and 'text' keys!")
    return _plain(list(tools) if tools is not None else None), _plain(documents)


def template_variables(special_tokens: dict[str, str], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The template's extra variables, as transformers builds them: the special tokens, then
    apply_chat_template's extra keyword arguments (which win). Its own options are not variables; those
    this module does not support raise unless left at their defaults."""
    for name in UNSUPPORTED_OPTIONS:
        if kwargs.get(name) not in (None, False, {}):
            raise NotImplementedError(f"apply_chat_template without transformers does not support {name}")
    return {**special_tokens, **{k: v for k, v in kwargs.items() if k not in UNSUPPORTED_OPTIONS}}


def render_chat(
    template: str,
    conversation: Sequence[Any],
    add_generation_prompt: bool = False,
    tools: list[dict] | None = None,
    documents: list[dict] | None = None,
    variables: dict[str, Any] | None = None,
    *,
    rules: TemplateRules,
) -> str:
    """One conversation rendered to text as a release with ``rules`` renders it; ``variables`` come from
    ``template_variables``."""
    messages = prepare_messages(conversation, rules)
    tools, documents = _checked_tools(tools, documents)
    extra = _plain(dict(variables or {}))
    return compile_template(template, rules.strict_sandbox).render(
        messages=messages,
        tools=tools,
        documents=documents,
        add_generation_prompt=add_generation_prompt,
        **extra,
    )
