"""The bytes a token can cover: a proven bound is a lower bound on a text's tokens (a prompt that fits is
never refused by its bytes), read from byte-level and byte-fallback BPE pipelines; pipelines that may drop
text get a guess, marked unproven."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers

from batchgen.model.loader import open_tokenizer
from batchgen.model.token_bound import TokenBytes, token_bytes

# Texts that are dense in bytes per token (long runs of what the vocabulary has long entries for), sparse
# (control characters the embedded vocabulary lacks), multi-byte, and spelled with special tokens.
_PIECES = [
    "\n" + " " * 40, "#" * 80, " " + "=" * 40, "-" * 64, "The quick brown fox. ", "naïve café — 東京 🙂 ",
    "\x04\x06\x13", "\U00050000", "<|im_start|>", "<|im_end|>\n", "0123456789", "\t\t\r\n", "\u0301e",
]  # fmt: skip


def _texts(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choices(_PIECES, k=rng.randint(1, 60))) for _ in range(count)]


def _holds_as_lower_bound(backend: Tokenizer, bound: TokenBytes, texts: list[str]) -> None:
    for text in texts:
        tokens = len(backend.encode(text, add_special_tokens=False).ids)
        assert tokens * bound.per_token >= bound.prompt_bytes(text), text


@pytest.fixture(scope="module")
def embedded(default_model_path):
    return open_tokenizer(default_model_path)


def test_the_embedded_tokenizer_has_a_proven_bound_that_no_text_beats(embedded):
    bound = token_bytes(embedded)
    # Its longest entry is "\n" and 80 spaces; the bytes it lacks (some control characters, lead bytes of
    # unassigned planes) are dropped by its BPE model, so they are not counted.
    assert bound.proven and bound.per_token == 81 and b"\x04" in bound.dropped and b"a" not in bound.dropped
    _holds_as_lower_bound(embedded.backend_tokenizer, bound, _texts(0, 300))
    dense = "\n" + " " * 80  # one token: the bound is tight
    assert len(embedded.backend_tokenizer.encode(dense).ids) == 1 and bound.prompt_bytes(dense) == 81


def test_prompt_bytes_counts_utf8_less_dropped_bytes():
    bound = TokenBytes(4.0, True, b"\x04\xf1")
    assert bound.prompt_bytes("ab\x04") == 2
    assert bound.prompt_bytes("é\x04\U00050000") == 2 + 3  # U+50000 is F1 90 80 80: its lead byte dropped
    assert bound.prompt_bytes("东" * 3_000_000) == 9_000_000  # counted a slice at a time
    assert bound.max_prompt_bytes(10) == 40


def _byte_fallback_tokenizer(**changes) -> Tokenizer:
    """A SentencePiece-style BPE ("▁" for spaces, bytes for unknown characters)."""
    vocab = {f"<0x{b:02X}>": b for b in range(256)}
    for piece in ("▁", "a", "b", "ab", "▁ab", "▁ab▁ab"):
        vocab[piece] = len(vocab)
    merges = [("a", "b"), ("▁", "ab"), ("▁ab", "▁ab")]
    model = changes.pop("model", None) or models.BPE(vocab, merges, byte_fallback=True)
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = changes.pop(
        "normalizer", normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    )
    tokenizer.pre_tokenizer = changes.pop("pre_tokenizer", None)
    tokenizer.add_special_tokens(changes.pop("added", [AddedToken("<s>", special=True)]))
    return tokenizer


def test_byte_fallback_bpe_is_proven():
    backend = _byte_fallback_tokenizer()
    bound = token_bytes(SimpleNamespace(backend_tokenizer=backend))
    assert bound.proven and bound.per_token == len("▁ab▁ab".encode())  # its longest entry, in UTF-8
    _holds_as_lower_bound(backend, bound, [" ab ab ab", "ab" * 50, "東京 🙂 ab", "<s> ab", " " * 30])


@pytest.mark.parametrize(
    "changes",
    [
        {"pre_tokenizer": pre_tokenizers.Whitespace()},  # drops whitespace
        {"pre_tokenizer": pre_tokenizers.Split(" ", "removed")},
        {"normalizer": normalizers.Strip()},  # a text's leading and trailing whitespace
        {"normalizer": normalizers.Replace(" ", "")},
        {"normalizer": normalizers.Replace(Regex(" +"), " ")},  # runs collapsed
        {"added": [AddedToken("<s>", special=True, rstrip=True)]},  # the whitespace after it
        {"model": models.BPE({"a": 0, "<unk>": 1}, [], unk_token="<unk>", fuse_unk=True)},  # runs -> 1
        {"model": models.WordLevel({"a": 0, "<unk>": 1}, unk_token="<unk>")},
    ],
    ids=[
        "whitespace",
        "split-removed",
        "strip",
        "replace-by-nothing",
        "regex",
        "rstrip",
        "fuse-unk",
        "words",
    ],
)
def test_pipelines_that_may_drop_text_get_a_guess(changes):
    bound = token_bytes(SimpleNamespace(backend_tokenizer=_byte_fallback_tokenizer(**changes)))
    assert not bound.proven and bound.per_token >= 16


def test_normalizers_that_shrink_text_widen_the_bound():
    nfkc = _byte_fallback_tokenizer(normalizer=normalizers.NFKC())
    bound = token_bytes(SimpleNamespace(backend_tokenizer=nfkc))
    assert bound.proven and bound.per_token == 4 * len("▁ab▁ab".encode())  # "𝐀" (4 bytes) -> "A" (1)
    _holds_as_lower_bound(nfkc, bound, ["𝐀" * 100, "ﬁ" * 50, "Ａ" * 40])


def test_a_tokenizer_without_a_rust_backend_gets_a_guess():
    slow = SimpleNamespace(get_vocab=lambda: {"a": 0, "hello": 1})
    assert token_bytes(slow) == TokenBytes(16 * 5, False)
