"""Reasoning output: the thinking block (``<think>`` ... ``</think>``) a model writes before its answer.

A parser is the pair of think tokens' ids and a rule for where an output begins, from the prompt's last
think token: inside a block when it is ``<think>`` (a template that opens the block), after one when it
is ``</think>`` (Qwen3's ``enable_thinking=false`` closes an empty block), and with none, before a block
for ``qwen3`` (``auto``'s choice) and inside one for ``deepseek_r1`` (vLLM's parser assumes R1 thinks
from its first token). A ``<think>`` as the output's first token opens a block. The split works on token
ids, so think tokens that decoding skips split as well as those it shows. Which parser a run uses is
decided from the model's tokenizer files, before the model loads, since the resume fingerprint needs it
(app/options.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

PARSER_NAMES = ("deepseek_r1", "qwen3")
CHOICES = ("auto", "none", *PARSER_NAMES)
# auto's parser: a block only where one is opened, so a model with think tokens that never thinks is unchanged
AUTO_PARSER = "qwen3"
THINK_START, THINK_END = "<think>", "</think>"
BEFORE, INSIDE, AFTER = "before", "inside", "after"  # where an output begins, next to a thinking block

Decode = Callable[[list[list[int]]], list[str]]  # many token id sequences -> their texts


@dataclass(frozen=True)
class ReasoningParser:
    name: str
    start: int  # the id of <think>
    end: int  # the id of </think>

    def output_begins(self, prompt_ids: Sequence[int]) -> str:
        """Where the output begins (BEFORE, INSIDE or AFTER a block), from the prompt's last think token."""
        last = _last_think_token(prompt_ids, self.start, self.end)
        if last is None:
            return INSIDE if self.name == "deepseek_r1" else BEFORE
        return INSIDE if last == self.start else AFTER


class Thinking(NamedTuple):
    """A row's reasoning parser and where its output begins (what the engine and the writer need)."""

    parser: ReasoningParser
    begins: str  # BEFORE, INSIDE or AFTER a thinking block (ReasoningParser.output_begins)


class ThinkSpans(NamedTuple):
    """Where an output's thinking and answer tokens are."""

    start: int  # the first thinking token
    stop: int  # one past the last thinking token: the </think> token, or the output's end
    answer: int  # the first answer token: after </think>, or the output's end when the block never closed

    @property
    def closed(self) -> bool:
        return self.answer > self.stop


def _last_think_token(ids: Sequence[int], start: int, end: int) -> int | None:
    """The last of ``start`` / ``end`` in ``ids`` (a reversed copy searched in C: prompts run long)."""
    backwards = list(reversed(ids))
    found = [(backwards.index(token), token) for token in (start, end) if token in backwards]
    return min(found)[1] if found else None


def think_spans(ids: Sequence[int], thinking: Thinking) -> ThinkSpans | None:
    """The output's thinking block, or None when it has none."""
    parser = thinking.parser
    if ids and ids[0] == parser.start:  # opened by the output (again, when the prompt had opened it)
        start = 1
    elif thinking.begins == INSIDE:
        start = 0
    else:
        return None
    try:
        stop = list(ids).index(parser.end, start)
    except ValueError:  # cut (length, a stop) or ended (EOS) while thinking: all of it is thinking
        return ThinkSpans(start, len(ids), len(ids))
    return ThinkSpans(start, stop, stop + 1)


def split_reasoning(
    ids: Sequence[int], thinking: Thinking, decode: Decode, cut: str | None = None
) -> tuple[str | None, str]:
    """(reasoning, completion) of an output: the block's text without its tags (None: no block), and
    what follows it, leading whitespace stripped as vLLM does. ``cut`` is the output's text when a stop
    string cut it (the whole output's text: stop strings count the thinking too)."""
    spans = think_spans(ids, thinking)
    if spans is None:
        return None, decode([list(ids)])[0] if cut is None else cut
    ids = list(ids)
    if cut is None:
        reasoning, answer = decode([ids[spans.start : spans.stop], ids[spans.answer :]])
        return reasoning, answer.lstrip()
    before, head, reasoning = decode([ids[: spans.start], ids[: spans.answer], ids[spans.start : spans.stop]])
    if spans.closed and len(cut) >= len(head):  # the stop string is in the answer
        return reasoning, cut[len(head) :].lstrip()
    return cut[len(before) :][: len(reasoning)], ""  # it is in the thinking: no answer was written


# -- which parser -----------------------------------------------------------------------------------------
def token_id(tokenizer: Any, text: str) -> int | None:
    """The id of ``text`` when it is one token of ``tokenizer`` (a loaded one), else None."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return backend.token_to_id(text)
    found = tokenizer.convert_tokens_to_ids(text)
    return None if found is None or found == tokenizer.unk_token_id else found


def parser_for(name: str | None, tokenizer: Any) -> ReasoningParser | None:
    """Parser ``name`` (None: no parser) on a loaded tokenizer; ValueError when it lacks the think tokens."""
    if name is None:
        return None
    start, end = token_id(tokenizer, THINK_START), token_id(tokenizer, THINK_END)
    if start is None or end is None:
        raise ValueError(
            f"--reasoning-parser {name}: the tokenizer has no {THINK_START} and {THINK_END} tokens"
        )
    return ReasoningParser(name, start, end)


def parser_name(choice: str, model_dir: Callable[[], str]) -> str | None:
    """The parser a run uses: ``choice``'s NAME, None for ``none``, and for ``auto`` the one the model's
    tokenizer files call for (``model_dir`` finds them; a model that cannot be read gets none here and
    fails to load later). ValueError: a NAME whose think tokens the tokenizer files lack."""
    if choice not in CHOICES:
        raise ValueError(f"--reasoning-parser {choice!r}: choose one of {', '.join(CHOICES)}")
    if choice == "none":
        return None
    found = _files_have_think_tokens(model_dir)
    if choice == "auto":
        return AUTO_PARSER if found else None
    if found is False:
        raise ValueError(f"--reasoning-parser {choice}: the model's tokenizer has no {THINK_START} and "
                         f"{THINK_END} tokens")  # fmt: skip
    return choice


def _files_have_think_tokens(model_dir: Callable[[], str]) -> bool | None:
    """Whether the tokenizer files hold both think tokens as single tokens; None when unreadable."""
    try:
        directory = Path(model_dir())
        return _tokenizer_json_has(directory / "tokenizer.json") or _added_tokens_have(directory)
    except Exception:  # a missing model, no hub access, a broken file: the model's loading says what
        return None


def _tokenizer_json_has(path: Path) -> bool:
    if not path.is_file():
        return False
    from tokenizers import Tokenizer

    backend = Tokenizer.from_file(str(path))
    return all(backend.token_to_id(text) is not None for text in (THINK_START, THINK_END))


def _added_tokens_have(directory: Path) -> bool:
    """A tokenizer without tokenizer.json (sentencepiece): its config's added tokens."""
    config = directory / "tokenizer_config.json"
    if not config.is_file():
        return False
    added = json.loads(config.read_text(encoding="utf-8")).get("added_tokens_decoder") or {}
    contents = {entry.get("content") for entry in added.values() if isinstance(entry, dict)}
    return {THINK_START, THINK_END} <= contents
