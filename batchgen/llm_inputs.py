"""The prompt forms ``LLM.generate`` and ``LLM.chat`` take, as vLLM's do, turned into token ids."""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Integral
from typing import Any, NamedTuple

from batchgen.config import SamplingParams
from batchgen.model.tokenize import Messages, Rendered, encode_rendered

_DICT_KEYS = {"prompt", "prompt_token_ids"}


class PromptInput(NamedTuple):
    """One prompt as the engine gets it, and the text it came from (None when given as token ids)."""

    text: str | None
    token_ids: list[int]


class ChatOptions(NamedTuple):
    """How ``LLM.chat`` renders conversations (vLLM's names and meanings)."""

    chat_template: str | None = None  # the template's text; None: the tokenizer's own
    chat_template_kwargs: dict[str, Any] | None = None  # more template variables, e.g. enable_thinking
    add_generation_prompt: bool = True
    tools: list[dict] | None = None


def prompt_inputs(tokenizer, prompts: Any) -> list[PromptInput]:
    """``prompts`` (one prompt or a sequence of them: strings, token-id lists, or vLLM's dicts
    ``{"prompt": text}`` / ``{"prompt_token_ids": ids}``) as token ids. Text is sent raw, with the
    tokenizer's special tokens, as vLLM's ``generate`` does: chat templates are ``chat``'s."""
    single = isinstance(prompts, (str, dict))
    forms = [_text_and_ids(prompt) for prompt in ([prompts] if single else prompts)]
    texts = [Rendered(text, True) for text, ids in forms if ids is None]
    encoded = iter(encode_rendered(tokenizer, texts))
    return [PromptInput(text, ids if ids is not None else next(encoded)) for text, ids in forms]


def _text_and_ids(prompt: Any) -> tuple[str | None, list[int] | None]:
    if isinstance(prompt, str):
        return prompt, None
    if isinstance(prompt, dict):
        return _dict_prompt(prompt)
    return None, _token_ids(prompt)


def _token_ids(value: Any) -> list[int]:
    if (
        isinstance(value, Sequence)
        and not isinstance(value, str)
        and all(isinstance(t, Integral) for t in value)
    ):
        return [int(t) for t in value]
    hint = "; a conversation (a list of messages) goes to LLM.chat" if _is_conversation(value) else ""
    raise TypeError(
        f"a prompt is a string, a list of token ids or a dict with 'prompt' or 'prompt_token_ids', "
        f"not {type(value).__name__}{hint}"
    )


def _dict_prompt(prompt: dict) -> tuple[str | None, list[int] | None]:
    unknown = sorted(set(prompt) - _DICT_KEYS)
    if unknown:  # multi_modal_data and the like: batchgen generates from text only
        raise ValueError(f"a dict prompt holds 'prompt' or 'prompt_token_ids' only, not {', '.join(unknown)}")
    text, ids = prompt.get("prompt"), prompt.get("prompt_token_ids")
    if text is None and ids is None:
        raise ValueError("a dict prompt needs 'prompt' or 'prompt_token_ids'")
    if text is not None and not isinstance(text, str):
        raise TypeError(f"a dict prompt's 'prompt' is a string, not {type(text).__name__}")
    return text, None if ids is None else _token_ids(ids)


def _is_conversation(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(isinstance(m, dict) for m in value)


def sampling_per_prompt(
    sampling_params: SamplingParams | Sequence[SamplingParams] | None, count: int, default: SamplingParams
) -> list[SamplingParams]:
    """One SamplingParams for every prompt (None: the model's defaults), or one per prompt."""
    if sampling_params is None or isinstance(sampling_params, SamplingParams):
        return [sampling_params or default] * count
    params = list(sampling_params)
    if len(params) != count:
        raise ValueError(f"{len(params)} sampling params for {count} prompts: give one, or one per prompt")
    return params


def conversations_of(messages: Messages | Sequence[Messages]) -> list[Messages]:
    """``chat``'s argument as a list of conversations: one conversation, or a sequence of them."""
    if _is_conversation(messages):
        return [list(messages)]
    return [list(conversation) for conversation in messages]


def chat_inputs(tokenizer, conversations: list[Messages], options: ChatOptions) -> list[PromptInput]:
    """Each conversation rendered by the chat template, then tokenized without special tokens of the
    tokenizer's own (the template writes them)."""
    rendered = [Rendered(_render(tokenizer, conversation, options), False) for conversation in conversations]
    ids = encode_rendered(tokenizer, rendered)
    return [PromptInput(r.text, token_ids) for r, token_ids in zip(rendered, ids, strict=True)]


def _render(tokenizer, conversation: Messages, options: ChatOptions) -> str:
    # As vLLM: the template kwargs are applied last, so they may override the named options.
    template_options = {
        "chat_template": options.chat_template,
        "add_generation_prompt": options.add_generation_prompt,
        "tools": options.tools,
    }
    template_options.update(options.chat_template_kwargs or {})
    return tokenizer.apply_chat_template(conversation, tokenize=False, **template_options)
