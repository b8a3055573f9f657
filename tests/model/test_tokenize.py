"""Batch decoding of completions (the writer thread) against the tokenizer's own ``decode``."""

from __future__ import annotations

import copy

from transformers import AutoTokenizer

from batchgen.model.tokenize import batch_decoder
from batchgen.testing.models import tokenizer_path


def _sequences(tokenizer) -> list[list[int]]:
    texts = ["Hello, world!  It's  fine .", "naïve café — 東京 🙂", "", "a\n\n b\tc"]
    seqs = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    special = [tokenizer.eos_token_id, *seqs[0], tokenizer.eos_token_id]  # dropped by skip_special_tokens
    split = seqs[1][:3]  # may end inside a multi-byte character
    return [*seqs, special, split, list(range(0, 3000, 7))]


def test_batch_decode_matches_decode_one_at_a_time():
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path())
    seqs = _sequences(tokenizer)
    want = [tokenizer.decode(ids, skip_special_tokens=True) for ids in seqs]
    assert batch_decoder(tokenizer)(seqs) == want


def test_a_tokenizer_that_cleans_up_spaces_decodes_through_its_own_decode():
    tokenizer = copy.deepcopy(AutoTokenizer.from_pretrained(tokenizer_path()))
    tokenizer.clean_up_tokenization_spaces = True
    calls = []
    decode = tokenizer.decode
    tokenizer.decode = lambda ids, **kw: calls.append(ids) or decode(ids, **kw)
    seqs = _sequences(tokenizer)
    assert batch_decoder(tokenizer)(seqs) == [decode(ids, skip_special_tokens=True) for ids in seqs]
    assert calls == seqs
