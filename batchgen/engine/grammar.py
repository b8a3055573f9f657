"""Structured output: JSON Schema, regex and choice constraints as per-step token masks (xgrammar).

A constraint is compiled once per distinct text (``GrammarCompiler``, on the prompt thread for
``batchgen run``), each (row, sample) gets its own matcher (``Guide``), the engine fills one bitmask row
per constrained sampled row on the host (``fill_masks``) and the sampler applies it to the logits on the
device (``apply_token_mask``). How this meets the asynchronous loop: docs/structured-output.md.

JSON is compact: one space after ``:`` and ``,`` (``json.dumps``' style), no other whitespace, so a
greedy model cannot loop on blanks.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from batchgen.config import SamplingParams

_XGR_PREFIX = re.compile(r"^\s*\[[^\]]*\]\s*\S+:\d+:\s*")  # "[12:00:00] /project/cpp/x.cc:12: "


class GrammarError(ValueError):
    """A constraint that does not compile: the row gets an ``error`` record."""


def constraint_of(params: SamplingParams) -> tuple[str, str] | None:
    """(kind, text): the cache key of a request's constraint, or None."""
    if params.json_schema is not None:
        return "json_schema", params.json_schema
    if params.regex is not None:
        return "regex", params.regex
    if params.choices is not None:
        return "choices", json.dumps(params.choices, ensure_ascii=False)
    return None


def _problem(exc: BaseException) -> str:
    """xgrammar's message without its timestamp and C++ source location."""
    lines = [_XGR_PREFIX.sub("", line) for line in str(exc).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def _choices_ebnf(choices: Sequence[str]) -> str:
    # JSON string literals are valid EBNF literals for xgrammar (same escapes).
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def check_json_schema(text: str) -> str | None:
    """Why a JSON Schema cannot be used, or None. Needs no tokenizer (for ``--json-schema FILE``)."""
    import xgrammar as xgr

    try:
        SamplingParams(json_schema=text)
        xgr.Grammar.from_json_schema(text, any_whitespace=False)
    except ValueError as exc:
        return str(exc)
    except RuntimeError as exc:
        return _problem(exc)
    return None


class GrammarCompiler:
    """Compiles constraints for one tokenizer; an LRU cache keyed by the constraint's text, errors too.

    Thread-safe: the prompt thread compiles, the engine thread (Python API) may too. xgrammar's own
    cache is off: ours is bounded, since per-row schemas may all differ.
    """

    def __init__(self, tokenizer: Any, model_vocab: int, stop_ids: Iterable[int], cache_size: int = 64):
        self._tokenizer, self._stop_ids = tokenizer, sorted(stop_ids)
        self._cache: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self._compiler = None
        self._batch = None
        # The grammar's vocabulary is the tokenizer's: ids past it (an LM head padded to a round size)
        # are never text, and xgrammar's per-token cost grows with every id it must treat as special.
        self.vocab = min(model_vocab, len(tokenizer))
        self.mask_width = -(-self.vocab // 32)  # int32 words a bitmask row
        self._stops: frozenset[int] = frozenset()  # the stop tokens xgrammar uses, once it is set up

    def _xgr(self):
        import xgrammar as xgr

        if self._compiler is None:
            stops = [i for i in self._stop_ids if i < self.vocab] or None
            # xgrammar reads transformers' tokenizer object: a FileTokenizer (model/files/) loads it now.
            loader = getattr(self._tokenizer, "transformers_tokenizer", None)
            tokenizer = loader() if loader is not None else self._tokenizer
            info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=self.vocab, stop_token_ids=stops)
            self._compiler = xgr.GrammarCompiler(info, cache_enabled=False)
            self._stops = frozenset(info.stop_token_ids)
            # Masks are filled by xgrammar's C++ threads: half the cores (its own default), at most 8.
            self._batch = xgr.BatchGrammarMatcher(max(1, min(8, (os.cpu_count() or 2) // 2)))
        return xgr

    def compile(self, params: SamplingParams) -> Any:
        """The compiled grammar of ``params``' constraint (GrammarError when it does not compile)."""
        key = constraint_of(params)
        if key is None:
            raise ValueError("these sampling parameters have no constraint")
        with self._lock:  # compiling is fast (milliseconds) next to tokenizing a batch: no need to overlap
            found = self._cache.get(key)
            if found is None:
                self._xgr()
                found = self._cache[key] = self._compile(*key)
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
            self._cache.move_to_end(key)
        if isinstance(found, GrammarError):
            raise found
        return found

    def _compile(self, kind: str, text: str) -> Any:
        try:
            if kind == "json_schema":
                return self._compiler.compile_json_schema(text, any_whitespace=False)
            if kind == "regex":
                return self._compiler.compile_regex(text)
            return self._compiler.compile_grammar(_choices_ebnf(json.loads(text)))
        except (RuntimeError, ValueError) as exc:
            return GrammarError(f"invalid {kind}: {_problem(exc)}")

    def guide(self, compiled: Any) -> Guide:
        import xgrammar as xgr

        return Guide(xgr.GrammarMatcher(compiled), self._stops)

    def fill_masks(self, guides: Sequence[Guide | None], out: torch.Tensor) -> None:
        """Row i of ``out`` ([S, mask_width] int32, CPU) = the tokens guides[i] allows next; all ones
        (every token) for rows without a live guide: unconstrained rows, rows whose grammar ended
        (their token in this step is discarded) and rows inside a thinking block (engine/thinking.py)."""
        live, rows, free, extra = [], [], [], []
        for i, guide in enumerate(guides):
            if guide is None or guide.done or guide.free:
                free.append(i)
                continue
            live.append(guide.matcher)
            rows.append(i)
            if guide.also_allowed is not None:
                extra.append((i, guide.also_allowed))
        if free:
            out[free] = -1
        if live:  # live guides exist only once a constraint was compiled: xgrammar is set up
            self._batch.batch_fill_next_token_bitmask(live, out, rows)
        for row, token in extra:
            allow_token(out, row, token)


class Guide:
    """One (row, sample)'s position in its grammar, advanced by each confirmed token."""

    __slots__ = ("matcher", "stops", "done")
    free = False  # never unconstrained (a thinking block's guide is: engine/thinking.py)
    also_allowed: int | None = None  # no token besides the grammar's

    def __init__(self, matcher: Any, stops: frozenset[int]) -> None:
        self.matcher, self.stops = matcher, stops
        self.done = False  # the grammar accepted its end (a stop token): nothing more may follow

    def accept(self, token: int) -> bool:
        """Advance by ``token``; False when the grammar refuses it (a masked sampler never picks one)."""
        ok = self.matcher.accept_token(token)
        if token in self.stops:  # only a stop token ends a grammar (asking every step costs host time a row)
            self.done = self.matcher.is_terminated()
        return ok


def allow_token(bitmask: torch.Tensor, row: int, token: int) -> None:
    """Set ``token``'s bit in row ``row`` of an int32 bitmask (bit 31 is the int32's sign)."""
    bit = 1 << (token % 32)
    bitmask[row, token // 32] |= bit - (1 << 32) if bit >= 1 << 31 else bit


def apply_token_mask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """logits [S, V] with the tokens each row's bitmask [S, W] int32 forbids set to -inf (no host sync).

    Token t is bit t % 32 of word t // 32. Ids past the bitmask (the LM head's padding beyond the
    tokenizer) are allowed only in all-ones rows, i.e. unconstrained ones: a grammar never allows every
    token (it forbids the special ones), so an all-ones row means "no constraint".
    """
    shifts = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    allowed = ((bitmask.unsqueeze(-1) >> shifts) & 1).flatten(1).bool()  # [S, W * 32]
    vocab = logits.shape[-1]
    if allowed.shape[1] >= vocab:
        allowed = allowed[:, :vocab]
    else:
        rest = (bitmask == -1).all(dim=1, keepdim=True).expand(-1, vocab - allowed.shape[1])
        allowed = torch.cat([allowed, rest], dim=1)
    return logits.masked_fill(~allowed, float("-inf"))
