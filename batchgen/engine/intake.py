"""Rows into requests: the checks a row must pass to run (its prompt's length, the KV it needs, the token
ids it names, its constraint), and the per-(row, sample) ``Request`` the scheduler runs, with what its
sampling parameters make of it (its random stream, its sparse logit adjustments, its log-probability
lists)."""

from __future__ import annotations

import itertools

from batchgen.config import SamplingParams
from batchgen.engine.block_manager import BlockManager
from batchgen.engine.completions import GenerationRequest
from batchgen.engine.grammar import GrammarCompiler, GrammarError, Guide
from batchgen.engine.request import Request
from batchgen.engine.sampler import rng_key
from batchgen.engine.step_sampling import MAX_ADJUSTMENTS
from batchgen.engine.thinking import ThinkingGuide


class Intake:
    def __init__(
        self, blocks: BlockManager, max_model_len: int, vocab_size: int | None, eos_ids: list[int],
        grammars: GrammarCompiler | None,
    ) -> None:  # fmt: skip
        self.blocks, self.max_model_len, self.vocab_size = blocks, max_model_len, vocab_size
        self.eos_ids, self.grammars = eos_ids, grammars
        self._ids = itertools.count()

    @staticmethod
    def samples(row: GenerationRequest) -> tuple[int, ...]:
        return row.samples if row.samples is not None else tuple(range(row.params.n))

    def requests(self, row: GenerationRequest) -> list[Request] | str:
        """A request per sample still to generate (siblings share sample 0's prompt), or why the row cannot
        run."""
        problem = self._problem(row)
        grammar = None
        if problem is None and row.params.constrained:
            grammar, problem = self._grammar(row)
        if problem is not None:
            return problem
        made: list[Request] = []
        for sample in self.samples(row):
            made.append(self._request(row, sample, made[0] if made else None, grammar))
        return made

    def _problem(self, row: GenerationRequest) -> str | None:
        n = len(row.prompt_ids)
        if n == 0:
            return "empty prompt"
        if n >= self.max_model_len:
            return f"prompt has {n} tokens; the model allows at most {self.max_model_len - 1}"
        need = self.blocks.blocks_for(min(n + row.params.max_new_tokens, self.max_model_len))
        if need > self.blocks.num_blocks:
            return (
                f"prompt + max_new_tokens need {need} KV blocks, the cache holds {self.blocks.num_blocks}: "
                "lower max_new_tokens or give the KV cache more memory"
            )
        return self._token_ids_problem(row.params)

    def _token_ids_problem(self, params: SamplingParams) -> str | None:
        """Why the token ids a row names (logit_bias, stop_token_ids) cannot be used, or None."""
        vocab = self.vocab_size
        named = (("logit_bias", [t for t, _ in params.logit_bias]), ("stop_token_ids", params.stop_token_ids))
        for name, ids in named:
            outside = [t for t in ids if vocab is not None and t >= vocab]
            if outside:
                return f"{name} names token {outside[0]}, outside the vocabulary (ids 0 to {vocab - 1})"
        count = len(self.adjustments(params))
        if count > MAX_ADJUSTMENTS:
            return f"logit_bias and min_tokens' stop ids change {count} tokens; at most {MAX_ADJUSTMENTS} may"
        return None

    def adjustments(self, params: SamplingParams) -> tuple[tuple[int, float, bool], ...]:
        """A row's sparse logit changes (engine/row_tokens.py): its bias, then its stop token ids held at
        -inf until min_tokens are out (vLLM's min_tokens: EOS and stop_token_ids)."""
        bias = tuple((token, value, False) for token, value in params.logit_bias)
        if not params.min_tokens:
            return bias
        stops = sorted(set(self.eos_ids) | set(params.stop_token_ids))
        return bias + tuple((token, float("-inf"), True) for token in stops)

    def _grammar(self, row: GenerationRequest) -> tuple[object | None, str | None]:
        """The row's compiled constraint (``batchgen run`` compiles it on the prompt thread), or why not."""
        if row.grammar is not None:
            return row.grammar, None
        if self.grammars is None:
            return None, "structured output needs a tokenizer"
        try:
            return self.grammars.compile(row.params), None
        except GrammarError as exc:
            return None, str(exc)

    def _guide(self, row: GenerationRequest, grammar: object | None) -> Guide | ThinkingGuide | None:
        """A sample's grammar matcher; behind the thinking block when the run parses reasoning."""
        if grammar is None:
            return None
        guide = self.grammars.guide(grammar)
        return guide if row.thinking is None else ThinkingGuide(guide, row.thinking)

    def _request(
        self, row: GenerationRequest, sample: int, parent: Request | None, grammar: object | None
    ) -> Request:
        n, params = len(row.prompt_ids), row.params
        return Request(
            request_id=next(self._ids),
            index=row.index,
            sample=sample,
            key=row.key,
            params=params,
            tokens=list(row.prompt_ids),
            num_prompt=n,
            max_tokens=min(params.max_new_tokens, self.max_model_len - n),
            rng_key=rng_key(params.seed, row.index, sample),
            parent=parent,
            logprobs=[] if params.logprobs is not None else None,
            guide=self._guide(row, grammar),
            thinking=row.thinking,
            adjustments=self.adjustments(params) if params.adjusted else (),
            top_logprobs=[] if params.logprobs else None,
            prompt_logprobs=None if params.prompt_logprobs is None else [None] * n,
            prompt_top_logprobs=[None] * n if params.prompt_logprobs else None,
        )
