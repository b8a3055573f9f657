"""The engine's per-(prompt, sample) outputs grouped into vLLM-shaped ``RequestOutput``s."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from operator import attrgetter

from tqdm.auto import tqdm

from batchgen.engine.completions import CompletionOutput as SampleOutput
from batchgen.llm_inputs import PromptInput
from batchgen.model.tokenize import TokenTexts
from batchgen.outputs import CompletionOutput, Logprob, PositionLogprobs, RequestOutput

Alternatives = list[tuple[int, float]]  # the engine's N most likely (token id, log-probability), best first


def progress_bar(use_tqdm: bool | Callable[..., tqdm], total: int) -> tqdm:
    """vLLM's bar over prompts; ``use_tqdm`` may be a tqdm-like class to draw it with."""
    draw = use_tqdm if callable(use_tqdm) else tqdm
    return draw(
        total=total, desc="Processed prompts", unit="prompt", disable=not use_tqdm, dynamic_ncols=True
    )


def collect_samples(
    outputs: Iterable[SampleOutput], counts: list[int], bar: tqdm
) -> list[list[SampleOutput]]:
    """Each prompt's ``counts[i]`` samples (in input order, by sample number) from the engine's outputs
    in completion order. The bar moves when a prompt's last sample is done."""
    samples: list[list[SampleOutput]] = [[] for _ in counts]
    started, generated = time.perf_counter(), 0
    with bar:
        for out in outputs:
            samples[out.index].append(out)
            generated += len(out.token_ids)
            if len(samples[out.index]) == counts[out.index]:
                elapsed = max(time.perf_counter() - started, 1e-9)
                bar.set_postfix_str(f"output: {generated / elapsed:.0f} toks/s", refresh=False)
                bar.update(1)
    return [sorted(group, key=attrgetter("sample")) for group in samples]


class ResultBuilder:
    """Builds the ``RequestOutput`` of a prompt from its samples; each token's text (a log-probability's
    ``decoded_token``) is decoded once per id."""

    def __init__(self, tokenizer) -> None:
        self.token_texts = TokenTexts(tokenizer)

    def request_output(
        self, request_id: str, prompt: PromptInput, samples: list[SampleOutput]
    ) -> RequestOutput:
        first = samples[0]  # every sample scores the same prompt
        prompt_logprobs = self._prompt_logprobs(prompt.token_ids, first)
        outputs = [self.completion(sample) for sample in samples]
        return RequestOutput(request_id, prompt.text, prompt.token_ids, prompt_logprobs, outputs)

    def completion(self, out: SampleOutput) -> CompletionOutput:
        logprobs = cumulative = None
        if out.logprobs is not None:
            alternatives = out.top_logprobs or [[] for _ in out.token_ids]
            logprobs = self._positions(out.token_ids, out.logprobs, alternatives)
            cumulative = float(sum(out.logprobs))
        text = out.text or ""
        return CompletionOutput(
            out.sample, text, list(out.token_ids), cumulative, logprobs, out.finish_reason, out.error
        )

    def _prompt_logprobs(
        self, prompt_ids: list[int], out: SampleOutput
    ) -> list[PositionLogprobs | None] | None:
        if out.prompt_logprobs is None:
            return None
        alternatives = out.prompt_top_logprobs or [None] * len(prompt_ids)
        scored = zip(prompt_ids, out.prompt_logprobs, alternatives, strict=True)
        return [None if lp is None else self._position(t, lp, top or []) for t, lp, top in scored]

    def _positions(
        self, ids: list[int], logprobs: list[float], alternatives: list[Alternatives]
    ) -> list[PositionLogprobs]:
        scored = zip(ids, logprobs, alternatives, strict=True)
        return [self._position(token, logprob, top) for token, logprob, top in scored]

    def _position(self, token: int, logprob: float, top: Alternatives) -> PositionLogprobs:
        """The chosen token first (ranked when it is among the N most likely), then the N most likely."""
        top_ids = [int(t) for t, _ in top]
        texts = self.token_texts([int(token), *top_ids])
        rank = top_ids.index(token) + 1 if token in top_ids else None
        position = {int(token): Logprob(float(logprob), rank, texts[0])}
        alternatives = zip(top_ids, (alt_logprob for _, alt_logprob in top), texts[1:], strict=True)
        for place, (token_id, alt_logprob, text) in enumerate(alternatives, 1):
            position.setdefault(token_id, Logprob(float(alt_logprob), place, text))
        return position
