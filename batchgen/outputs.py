"""What ``LLM.generate`` and ``LLM.chat`` return: vLLM's ``RequestOutput`` shape, one per prompt.

The engine's own per-(row, sample) result is ``batchgen.engine.completions.CompletionOutput`` (what
``LLM.stream`` yields); these types group a prompt's samples the way vLLM users read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Logprob:
    """One token's log-probability at one position. ``rank`` is its place in the model's distribution
    (1 = most likely), None for a sampled token outside the ``logprobs`` N most likely."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# Per position, token id -> its Logprob: the chosen token first, then the N most likely.
PositionLogprobs = dict[int, Logprob]


@dataclass
class CompletionOutput:
    """One sample of a prompt. ``index`` is the sample number (0 .. n-1). ``finish_reason`` is "stop",
    "length", or "error" (batchgen's: the prompt could not run, ``error`` says why)."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[PositionLogprobs] | None
    finish_reason: str | None
    error: str | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """One prompt's result: its ``n`` samples in ``outputs``, by sample number. ``prompt`` is the text the
    prompt was tokenized from (None for token ids); ``prompt_logprobs`` has None for the first token."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: list[PositionLogprobs | None] | None
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = True
