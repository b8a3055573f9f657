"""Prompt -> token ids: chat templates, system prompts, raw prompts."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, NamedTuple

Messages = list[dict[str, Any]]


class Rendered(NamedTuple):
    """A prompt as text, before tokenizing."""

    text: str
    special_tokens: bool  # add the tokenizer's own special tokens (raw prompts; a chat template has its own)


def has_chat_template(tokenizer, chat_template: str | None = None) -> bool:
    """Whether prompts can be rendered as chats: the model's template, or one given instead of it."""
    return bool(chat_template or getattr(tokenizer, "chat_template", None))


def build_messages(prompt: str | Messages, system_prompt: str | None) -> Messages:
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if system_prompt and not (messages and messages[0].get("role") == "system"):
        messages = [{"role": "system", "content": system_prompt}, *messages]
    return messages


def render_prompt(
    tokenizer,
    prompt: str | Messages,
    chat: bool | None = None,
    system_prompt: str | None = None,
    *,
    chat_template: str | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> Rendered:
    """The text a prompt is tokenized from.

    ``chat=None`` ("auto"): message lists always get the chat template; plain strings get it when there
    is one. ``chat=False`` sends plain strings raw (message lists still need a template).
    ``chat_template`` (Jinja text) replaces the model's; ``chat_template_kwargs`` become template
    variables and ``tools`` the template's ``tools``, as in transformers' ``apply_chat_template``.
    """
    has_template = has_chat_template(tokenizer, chat_template)
    use_chat = not isinstance(prompt, str) or (chat is not False and has_template)
    if chat is True and not has_template:
        raise ValueError("the model's tokenizer has no chat template; use --no-chat or --chat-template")
    if not use_chat:
        return Rendered(prompt, True)
    if not has_template:
        raise ValueError(
            "a 'messages' row needs a chat template, and the model's has none: give --chat-template"
        )
    text = tokenizer.apply_chat_template(
        build_messages(prompt, system_prompt), tools=tools, chat_template=chat_template,
        add_generation_prompt=True, tokenize=False, **(chat_template_kwargs or {}),
    )  # fmt: skip
    return Rendered(text, False)  # what apply_chat_template(tokenize=True) encodes


def _encoding_backend(tokenizer):
    """The Rust tokenizer when encoding through it gives transformers' ``encode`` ids, else None."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(tokenizer, "split_special_tokens", False):
        return None
    if backend.truncation is not None or backend.padding is not None:
        return None
    return backend


def encode_rendered(tokenizer, prompts: list[Rendered]) -> list[list[int]]:
    """Token ids of many rendered prompts. A fast tokenizer encodes them in one Rust ``encode_batch``
    call per special-token setting, which releases the GIL while it works (the engine thread keeps the
    interpreter) and skips transformers' per-call Python (more than half of a chat prompt's encoding time).
    Others go one at a time through ``encode``, as does a tokenizer whose ``tokenizer.json`` turns on
    truncation or padding (the backend would apply them; ``encode`` turns them off). Both give
    ``encode``'s ids."""
    backend = _encoding_backend(tokenizer)
    if backend is None:
        return [list(tokenizer.encode(p.text, add_special_tokens=p.special_tokens)) for p in prompts]
    ids: list[list[int]] = [[] for _ in prompts]
    for special in (True, False):
        picked = [i for i, p in enumerate(prompts) if p.special_tokens is special]
        if not picked:
            continue
        encodings = backend.encode_batch([prompts[i].text for i in picked], add_special_tokens=special)
        for i, encoding in zip(picked, encodings, strict=True):
            ids[i] = encoding.ids
    return ids


def encode_prompt(
    tokenizer,
    prompt: str | Messages,
    chat: bool | None = None,
    system_prompt: str | None = None,
    **template: Any,  # render_prompt's chat_template, chat_template_kwargs and tools
) -> list[int]:
    """Token ids for one prompt (``render_prompt``'s rules)."""
    return encode_rendered(tokenizer, [render_prompt(tokenizer, prompt, chat, system_prompt, **template)])[0]


def batch_decoder(tokenizer) -> Callable[..., list[str]]:
    """``decode(seqs, skip_special_tokens=True)``: many completions in one call. A fast tokenizer whose
    decode adds no Python clean-up goes straight to its Rust ``decode_batch``, which releases the GIL while
    it works: the engine thread keeps the interpreter (one decode at a time would hold it for each whole
    completion). Any other tokenizer decodes one sequence at a time, exactly as ``decode`` does."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return lambda seqs, skip_special_tokens=True: backend.decode_batch(seqs, skip_special_tokens)
    return lambda seqs, skip_special_tokens=True: [
        tokenizer.decode(ids, skip_special_tokens=skip_special_tokens) for ids in seqs
    ]


class TokenTexts:
    """Each token id's own text (the ``token`` of a log-probability entry, special tokens included),
    decoded once per id for the whole run."""

    def __init__(self, tokenizer) -> None:
        self.decode = batch_decoder(tokenizer)
        self.texts: dict[int, str] = {}

    def __call__(self, ids: list[int]) -> list[str]:
        missing = list(dict.fromkeys(i for i in ids if i not in self.texts))
        if missing:
            self.texts.update(zip(missing, self.decode([[i] for i in missing], False), strict=True))
        return [self.texts[i] for i in ids]


def backend_only(tokenizer) -> bool:
    """True when ``encode_rendered`` and ``batch_decoder`` reach the tokenizer only through its Rust
    backend's batch calls (and chat templates only render text): nothing a thread does changes it."""
    return _encoding_backend(tokenizer) is not None and not getattr(
        tokenizer, "clean_up_tokenization_spaces", False
    )


def tokenizer_for_thread(tokenizer):
    """The tokenizer a helper thread (prompt preparer, writer) encodes or decodes with. Threads share a
    backend-only one: its calls only read the Rust tokenizer, concurrently and with the GIL released.
    Any other gets its own copy: transformers' ``encode`` may reconfigure the Rust tokenizer (turn its
    truncation or padding off), which would change what another thread's calls do mid-run. A copy adds
    to start-up in proportion to the vocabulary, so only such tokenizers are copied."""
    return tokenizer if backend_only(tokenizer) else copy.deepcopy(tokenizer)
