"""The most bytes of prompt text one token can stand for, read from a tokenizer's vocabulary and pipeline.

A prompt whose rendered text has more bytes than ``max_model_len - 1`` such tokens can cover cannot fit,
so it is refused without being tokenized: encoding tens of MB costs GiBs (each token's ``Encoding`` keeps
offsets, type ids and masks beside its id), while the text itself costs its size.

The bound is proven where every byte of the text ends up in some token and no token covers more than the
longest entry of the vocabulary (or added token): a BPE model that covers every byte (byte-level, or with
byte fallback), with normalizers that shrink text by a known factor at most and pre-tokenizers and added
tokens that drop nothing. A byte-level vocabulary may lack a few byte values (control characters, lead
bytes of unassigned planes): the model drops those bytes, so they are not counted. Any other pipeline (one
that strips whitespace or control characters, maps unknown text to one unknown token, a tokenizer without
a Rust backend) gets a generous guess instead.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

# Unicode normalization (NFC ... NFKD) and lowercasing shrink UTF-8 text at most 4 times: a 4-byte letter
# becomes a 1-byte one ("𝐀" -> "A" under NFKC); a composition never beats that (Hangul L+V+T: 9 -> 3).
_UNICODE_SHRINK = 4.0
_UNICODE_NORMALIZERS = ("NFC", "NFD", "NFKC", "NFKD", "Lowercase")
# Pre-tokenizers that only split or re-spell text, never drop any (unless their behaviour is "Removed").
_KEEPING_PRE_TOKENIZERS = ("ByteLevel", "Metaspace", "Split", "Punctuation", "Digits", "UnicodeScripts")
# Where nothing is proven: this many times the longest token. A prompt refused under it would have to
# average more bytes a token than sixteen of the vocabulary's longest entries, i.e. be nearly all text the
# tokenizer drops.
_GUESS_FACTOR = 16
_COUNT_STEP = 1 << 20  # characters encoded at a time to count a non-ASCII text's bytes


class TokenBytes(NamedTuple):
    """At most ``per_token`` bytes of raw prompt text go into one token (``proven``: for certain), bytes of
    the values in ``dropped`` into none."""

    per_token: float
    proven: bool
    dropped: bytes = b""

    def max_prompt_bytes(self, max_tokens: int) -> int:
        """The most bytes a prompt of ``max_tokens`` tokens can have."""
        return int(max_tokens * self.per_token)

    def prompt_bytes(self, text: str) -> int:
        """The bytes of ``text`` that become tokens: its UTF-8 size less the bytes the model drops, counted
        a slice at a time (no full copy of a huge text)."""
        if text.isascii():
            return len(text) - sum(text.count(chr(b)) for b in self.dropped if b < 0x80)
        total = 0
        for i in range(0, len(text), _COUNT_STEP):
            piece = text[i : i + _COUNT_STEP].encode("utf-8", "surrogatepass")
            total += len(piece.translate(None, self.dropped) if self.dropped else piece)
        return total


def token_bytes(tokenizer: Any) -> TokenBytes:
    """How many bytes of prompt text one token of ``tokenizer`` can cover at most."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:  # a tokenizer in Python: its pipeline is not read
        return TokenBytes(_GUESS_FACTOR * _longest(tokenizer.get_vocab(), False), False)
    pre = _spec(backend.pre_tokenizer)
    byte_level = _has_byte_level(pre)
    vocab = backend.get_vocab(with_added_tokens=False)
    added = list(backend.get_added_tokens_decoder().values())
    longest = max([_longest(vocab, byte_level), *(len(t.content.encode()) for t in added)])
    shrink = _shrink(_spec(backend.normalizer))
    dropped = _dropped_bytes(backend.model, vocab, byte_level)
    # Which bytes are dropped is counted in the text before normalization: only where there is none.
    dropping = dropped is None or (dropped and backend.normalizer is not None)
    drops = any(t.lstrip or t.rstrip for t in added) or not _pre_tokenizer_keeps(pre)
    if shrink is None or drops or dropping:
        return TokenBytes(_GUESS_FACTOR * longest, False)
    return TokenBytes(shrink * longest, True, dropped)


def _spec(component: Any) -> dict[str, Any] | None:
    """A normalizer's or pre-tokenizer's own JSON (as in tokenizer.json), or None when there is none."""
    return None if component is None else json.loads(component.__getstate__())


def _longest(vocab: dict[str, int], byte_level: bool) -> int:
    """The most raw bytes a vocabulary entry covers: a byte-level entry has one character a byte."""
    return max((len(token) if byte_level else len(token.encode()) for token in vocab), default=1)


def _has_byte_level(spec: dict[str, Any] | None) -> bool:
    if spec is None:
        return False
    if spec.get("type") == "Sequence":
        return any(_has_byte_level(part) for part in spec.get("pretokenizers", []))
    return spec.get("type") == "ByteLevel"


def _pre_tokenizer_keeps(spec: dict[str, Any] | None) -> bool:
    """Whether every character reaches the model (splitting, byte mapping and "▁" spelling keep them)."""
    if spec is None:
        return True
    if spec.get("type") == "Sequence":
        return all(_pre_tokenizer_keeps(part) for part in spec.get("pretokenizers", []))
    return spec.get("type") in _KEEPING_PRE_TOKENIZERS and spec.get("behavior") != "Removed"


def _shrink(spec: dict[str, Any] | None) -> float | None:
    """How many times fewer bytes the normalizer can leave of a text; None where it can delete text."""
    if spec is None:
        return 1.0
    kind = spec.get("type")
    if kind == "Sequence":
        total = 1.0
        for part in spec.get("normalizers", []):
            factor = _shrink(part)
            if factor is None:
                return None
            total *= factor
        return total
    if kind in _UNICODE_NORMALIZERS:
        return _UNICODE_SHRINK
    if kind == "Prepend":
        return 1.0
    if kind == "Replace":  # a fixed string by a non-empty one: shrinks by their ratio at most
        pattern, content = spec.get("pattern", {}).get("String"), spec.get("content")
        if pattern and content:
            return max(1.0, len(pattern.encode()) / len(content.encode()))
    return None


def _dropped_bytes(model: Any, vocab: dict[str, int], byte_level: bool) -> bytes | None:
    """The byte values a BPE model gives no token of their own (it drops them, or with an unknown token
    may fuse a run of them into one); None where unknown text cannot be told by its bytes."""
    if type(model).__name__ != "BPE" or getattr(model, "continuing_subword_prefix", None):
        return None
    if byte_level:
        return bytes(b for b, ch in enumerate(_byte_level_alphabet()) if ch not in vocab)
    if getattr(model, "byte_fallback", False) and all(f"<0x{b:02X}>" in vocab for b in range(256)):
        return b""
    return None


def _byte_level_alphabet() -> list[str]:
    """The characters a byte-level pre-tokenizer spells the bytes 0 ... 255 with (GPT-2's mapping)."""
    printable = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}  # spelled as themselves
    others = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(others)) for b in range(256)]
