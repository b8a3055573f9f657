"""Finish checks after each appended token: EOS and stop token ids, stop strings (on decoded text), length."""

from __future__ import annotations

from batchgen.engine.request import Request

_STOP_WINDOW_SLACK = 8  # extra tokens decoded around a stop string: tokens can be partial characters


class StopChecker:
    def __init__(self, tokenizer, eos_ids: set[int]) -> None:
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids

    def check(self, req: Request) -> str | None:
        """The finish reason after ``req``'s newest token, or None to go on. Sets ``req.text`` on a stop
        string. Before ``min_tokens`` tokens are out, only the length ends a row (vLLM's rule: the sampler
        holds EOS and the stop token ids back meanwhile)."""
        tokens, params = req.tokens, req.params  # once a token per row and step: no property calls here
        out = len(tokens) - req.num_prompt
        if out >= params.min_tokens:
            last = tokens[-1]
            if (last in self.eos_ids and not params.ignore_eos) or last in params.stop_token_ids:
                return "stop"
            if params.stop and self._stop_string_matched(req):
                return "stop"
        if out >= req.max_tokens:
            return "length"
        return None

    def _stop_string_matched(self, req: Request) -> bool:
        # Every token decodes to at least one byte, so a stop string of L bytes spans at most L tokens.
        params = req.params
        longest = max(len(s.encode()) for s in params.stop)
        window = req.output_ids[-(longest + _STOP_WINDOW_SLACK) :]
        tail = self.decode(window, params.skip_special_tokens)
        if not any(s in tail for s in params.stop):
            return False
        text = self.decode(req.output_ids, params.skip_special_tokens)
        found = [(text.find(s), s) for s in params.stop if s in text]
        if not found:  # the window saw it only through a decoding artefact at its left edge
            return False
        cut, stop = min(found)
        req.text = text[: cut + len(stop)] if params.include_stop_str_in_output else text[:cut]
        return True

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)
