"""What goes into the engine and what comes out of it: a row to generate for (``GenerationRequest``) and
one sample's completion (``CompletionOutput``), the engine's public value types."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from batchgen.config import SamplingParams

if TYPE_CHECKING:
    from batchgen.model.reasoning import Thinking


class GenerationRequest(NamedTuple):
    """One input row, already tokenized.

    ``index`` is the row's 0-based position in the whole input: together with the seed and the sample
    number it fixes the random stream, so outputs do not depend on batching, sharding or resume.
    ``samples`` lists the sample numbers still to generate (default: all of 0..n-1); a resumed run
    passes only the missing ones.
    """

    index: int
    prompt_ids: list[int]
    params: SamplingParams
    key: Any = None  # opaque to the engine (the CLI passes the row's id and kept columns)
    samples: tuple[int, ...] | None = None
    grammar: Any = None  # params' constraint compiled ahead (engine/grammar.py); None: the engine compiles
    # A run with a reasoning parser: its think tokens and whether the prompt left a block open. A
    # constraint then applies after the block (engine/thinking.py); the output carries it to the writer.
    thinking: Thinking | None = None


class CompletionOutput(NamedTuple):
    """One finished (row, sample)."""

    index: int
    sample: int
    key: Any
    token_ids: list[int]
    text: str | None  # None when not detokenized, except after a stop string: its cut text is given
    finish_reason: str  # "stop" | "length" | "error"
    prompt_tokens: int
    logprobs: list[float] | None = None
    error: str | None = None
    # per output token: (token id, log-probability) of the ``logprobs`` N most likely, the best first
    top_logprobs: list[tuple[tuple[int, float], ...]] | None = None
    # per prompt token: its log-probability (None for the first), and the ``prompt_logprobs`` N most likely
    prompt_logprobs: list[float | None] | None = None
    prompt_top_logprobs: list[tuple[tuple[int, float], ...] | None] | None = None
    skip_special_tokens: bool = True  # how its text is decoded (the row's option)
    thinking: Thinking | None = (
        None  # the request's: where the output's thinking block is (model/reasoning.py)
    )

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids)
