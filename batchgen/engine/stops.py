"""Finish checks after each appended token: EOS, stop strings (on decoded text), length."""

from __future__ import annotations

from batchgen.engine.request import Request

_STOP_WINDOW_SLACK = 8  # extra tokens decoded around a stop string: tokens can be partial characters


class StopChecker:
    def __init__(self, tokenizer, eos_ids: set[int]) -> None:
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids

    def check(self, req: Request) -> str | None:
        """The finish reason after ``req``'s newest token, or None to go on. Sets ``req.text`` on a stop."""
        tokens, params = req.tokens, req.params  # once a token per row and step: no property calls here
        if tokens[-1] in self.eos_ids and not params.ignore_eos:
            return "stop"
        if params.stop and self._stop_string_matched(req):
            return "stop"
        if len(tokens) - req.num_prompt >= req.max_tokens:
            return "length"
        return None

    def _stop_string_matched(self, req: Request) -> bool:
        # Every token decodes to at least one byte, so a stop string of L bytes spans at most L tokens.
        longest = max(len(s.encode()) for s in req.params.stop)
        window = req.output_ids[-(longest + _STOP_WINDOW_SLACK) :]
        tail = self.decode(window)
        if not any(s in tail for s in req.params.stop):
            return False
        text = self.decode(req.output_ids)
        cut = min((text.find(s) for s in req.params.stop if s in text), default=-1)
        if cut < 0:  # the window saw it only through a decoding artefact at its left edge
            return False
        req.text = text[:cut]
        return True

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)
