"""Sharding arithmetic: which heads, rows and vocabulary each rank holds, and what cannot be split."""

from __future__ import annotations

import pytest

from batchgen.distributed.shard import Span, head_shard, tensor_parallel_problem, vocab_span


def test_heads_split_evenly_when_kv_heads_cover_the_ranks():
    shards = [head_shard(32, 8, rank, 4) for rank in range(4)]
    assert [s.q for s in shards] == [Span(0, 8), Span(8, 16), Span(16, 24), Span(24, 32)]
    assert [s.kv for s in shards] == [Span(0, 2), Span(2, 4), Span(4, 6), Span(6, 8)]


def test_kv_heads_are_replicated_when_fewer_than_ranks():
    """Each rank keeps the KV head its query heads read: query head h reads KV head h // (Hq / Hkv)."""
    q_heads, kv_heads, size = 8, 2, 4
    group = q_heads // kv_heads
    for rank in range(size):
        shard = head_shard(q_heads, kv_heads, rank, size)
        assert shard.kv.size == 1
        assert {h // group for h in range(*shard.q)} == {shard.kv.start}


def test_vocab_ranges_tile_the_vocabulary():
    spans = [vocab_span(49155, rank, 4) for rank in range(4)]
    assert spans[0].start == 0 and spans[-1].stop == 49155
    assert all(a.stop == b.start for a, b in zip(spans, spans[1:], strict=False))
    assert len({s.size for s in spans[:-1]}) == 1  # only the last range may be shorter


@pytest.mark.parametrize(
    ("size", "q", "kv", "inter", "message"),
    [
        (3, 4, 2, 128, "does not divide the model's 4 attention heads"),
        (2, 4, 3, 128, "does not divide the model's 3 key/value heads"),
        (4, 8, 3, 128, "not a multiple of the model's 3 key/value heads"),
        (2, 4, 2, 129, "does not divide the model's intermediate_size (129)"),
    ],
)
def test_indivisible_models_are_refused_naming_the_counts(size, q, kv, inter, message):
    assert message in tensor_parallel_problem(size, q, kv, {"intermediate_size": inter})


def test_the_embedded_model_splits_over_three_ranks():
    assert tensor_parallel_problem(3, 9, 3, {"intermediate_size": 1536}) is None
