"""Structured output behind a thinking block: the grammar applies to what follows ``</think>``.

A ``ThinkingGuide`` wraps a row's grammar ``Guide`` and walks the row's tokens through three states: before
a block (the prompt has none: the grammar's tokens and ``<think>`` are allowed), inside one (every token:
an all-ones mask, and nothing reaches the grammar), after it (the grammar, from its start; a prompt that
closed a block, as Qwen3's with thinking off, begins here). The engine fills masks and accepts tokens
through the same attributes as a plain ``Guide`` (``GrammarCompiler.fill_masks``): ``free`` and
``also_allowed`` say what the mask is.
"""

from __future__ import annotations

from typing import Any

from batchgen.model.reasoning import AFTER, BEFORE, INSIDE, Thinking


class ThinkingGuide:
    __slots__ = ("inner", "start", "end", "state")

    def __init__(self, inner: Any, thinking: Thinking) -> None:
        self.inner = inner  # the row's grammar Guide (engine/grammar.py)
        self.start, self.end = thinking.parser.start, thinking.parser.end
        self.state = thinking.begins

    @property
    def matcher(self) -> Any:
        return self.inner.matcher

    @property
    def done(self) -> bool:
        return self.inner.done

    @property
    def free(self) -> bool:
        """Inside the block: every token may follow (an all-ones mask)."""
        return self.state == INSIDE

    @property
    def also_allowed(self) -> int | None:
        """A token allowed besides the grammar's: ``<think>`` while the block may still open."""
        return self.start if self.state == BEFORE else None

    def accept(self, token: int) -> bool:
        """Advance by ``token``; False when the grammar refuses it."""
        if self.state == INSIDE:
            if token == self.end:
                self.state = AFTER
            return True
        if self.state == BEFORE:
            if token == self.start:
                self.state = INSIDE
                return True
            self.state = AFTER  # the answer began without a block: no block may open later
        return self.inner.accept(token)
