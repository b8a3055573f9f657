"""Which row keys set a sampling parameter, and which only look like one: a misspelling of a parameter
(``temprature``, ``max_token``, ``topP``) or a sampling option of vLLM or transformers that batchgen does
not have (``best_of``, ``num_beams``). Those are refused, so that nothing a user sends is silently ignored;
any other key is data and is left alone.
"""

from __future__ import annotations

import re
from functools import lru_cache

from batchgen.config import PARAM_NAMES

# Sampling options of vLLM's SamplingParams (and its OpenAI server) and of transformers' generate that
# batchgen does not have, with the parameter to use instead where there is one.
UNSUPPORTED = {
    "best_of": "n", "use_beam_search": None, "length_penalty": None, "early_stopping": None,
    "bad_words": "logit_bias", "allowed_token_ids": "logit_bias", "truncate_prompt_tokens": None,
    "logits_processors": None, "output_kind": None, "detokenize": None, "spaces_between_special_tokens": None,
    "guided_decoding": "json_schema", "structured_outputs": "json_schema",
    "guided_json": "json_schema", "guided_regex": "regex", "guided_choice": "choices", "guided_grammar": None,
    "extra_args": None, "do_sample": "temperature", "num_beams": None, "num_return_sequences": "n",
    "no_repeat_ngram_size": None, "typical_p": None, "epsilon_cutoff": None, "eta_cutoff": None,
}  # fmt: skip


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


_KNOWN = {_norm(name): name for name in [*PARAM_NAMES, *UNSUPPORTED]}


def _distance(a: str, b: str, most: int) -> int:
    """Levenshtein distance of ``a`` and ``b``, or ``most + 1`` once it exceeds ``most``."""
    if abs(len(a) - len(b)) > most:
        return most + 1
    row = list(range(len(b) + 1))
    for i, char in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, other in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (char != other))
        if min(row) > most:
            return most + 1
    return row[-1]


def _resembled(key: str) -> str | None:
    """The known name ``key`` is a near miss of: the same letters and digits (``topP``, ``top-p``), or one
    edit away for names of 7+ of them, two for 10+ (short names are left alone: ``step`` is data)."""
    norm = _norm(key)
    if norm in _KNOWN:
        return _KNOWN[norm]
    most = 2 if len(norm) >= 10 else 1 if len(norm) >= 7 else 0
    if not most:
        return None
    near = [(_distance(norm, known, most), name) for known, name in _KNOWN.items()]
    best = min(near)
    return best[1] if best[0] <= most else None


@lru_cache(maxsize=4096)
def key_problem(key: str) -> str | None:
    """Why row key ``key`` is refused, or None (a sampling parameter, or data)."""
    if key in PARAM_NAMES:
        return None
    name = key if key in UNSUPPORTED else _resembled(key)
    if name is None:
        return None
    if name in UNSUPPORTED:
        instead = UNSUPPORTED[name]
        hint = f" (use {instead!r})" if instead else ""
        same = "" if name == key else f", like {name!r}"
        return f"sampling key {key!r}{same}: batchgen has no such option{hint}"
    return f"unknown sampling key {key!r} (did you mean {name!r}?)"
