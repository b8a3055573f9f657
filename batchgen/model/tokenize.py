"""Prompt -> token ids: chat templates, system prompts, raw prompts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Messages = list[dict[str, Any]]


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def build_messages(prompt: str | Messages, system_prompt: str | None) -> Messages:
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if system_prompt and not (messages and messages[0].get("role") == "system"):
        messages = [{"role": "system", "content": system_prompt}, *messages]
    return messages


def encode_prompt(
    tokenizer,
    prompt: str | Messages,
    chat: bool | None = None,
    system_prompt: str | None = None,
) -> list[int]:
    """Token ids for one prompt.

    ``chat=None`` ("auto"): message lists always get the chat template; plain strings get it when the
    tokenizer has one. ``chat=False`` sends plain strings raw (message lists still need a template).
    """
    use_chat = not isinstance(prompt, str) or (chat is not False and has_chat_template(tokenizer))
    if chat is True and not has_chat_template(tokenizer):
        raise ValueError("the model's tokenizer has no chat template; use --no-chat")
    if not use_chat:
        return list(tokenizer.encode(prompt, add_special_tokens=True))
    if not has_chat_template(tokenizer):
        raise ValueError("a 'messages' row needs a chat template, and the model's tokenizer has none")
    ids = tokenizer.apply_chat_template(
        build_messages(prompt, system_prompt), add_generation_prompt=True, tokenize=True
    )
    if isinstance(ids, dict) or hasattr(ids, "keys"):  # transformers >= 5 returns a BatchEncoding
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def batch_decoder(tokenizer) -> Callable[[list[list[int]]], list[str]]:
    """Decode many completions in one call (``skip_special_tokens``). A fast tokenizer whose decode adds
    no Python clean-up goes straight to its Rust ``decode_batch``, which releases the GIL while it works:
    the engine thread keeps the interpreter (one decode at a time holds it, ~55 us per 256-token
    completion). Any other tokenizer decodes one sequence at a time, exactly as ``decode`` does."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return lambda seqs: backend.decode_batch(seqs, skip_special_tokens=True)
    return lambda seqs: [tokenizer.decode(ids, skip_special_tokens=True) for ids in seqs]
