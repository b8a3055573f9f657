"""Megatron-style sharding arithmetic: which rows of each weight a rank holds.

Attention is split by heads (q heads evenly; KV heads evenly, or replicated when there are fewer KV heads
than ranks: each rank then keeps the one KV head its query heads read). MLPs are split by the
intermediate dimension, the vocabulary into contiguous ranges (the last one may be shorter).
"""

from __future__ import annotations

from typing import NamedTuple


class Span(NamedTuple):
    """Rows (or columns) [start, stop) of a weight."""

    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start

    def scaled(self, factor: int) -> Span:
        """The same span in units ``factor`` times smaller (heads -> rows of head_dim each)."""
        return Span(self.start * factor, self.stop * factor)


class HeadShard(NamedTuple):
    q: Span  # query heads of this rank
    kv: Span  # key/value heads of this rank


def even_span(total: int, rank: int, size: int) -> Span:
    if total % size:
        raise ValueError(f"{total} does not split evenly over {size} ranks")
    part = total // size
    return Span(rank * part, (rank + 1) * part)


def head_shard(q_heads: int, kv_heads: int, rank: int, size: int) -> HeadShard:
    q = even_span(q_heads, rank, size)
    if kv_heads >= size:
        return HeadShard(q, even_span(kv_heads, rank, size))
    head = rank * kv_heads // size  # replicated: the KV head this rank's query heads use
    return HeadShard(q, Span(head, head + 1))


def vocab_span(vocab: int, rank: int, size: int) -> Span:
    part = -(-vocab // size)
    return Span(min(rank * part, vocab), min((rank + 1) * part, vocab))


def tensor_parallel_problem(
    size: int, q_heads: int, kv_heads: int, intermediate: dict[str, int]
) -> str | None:
    """Why ``size`` ranks cannot split this model (None when they can), naming the counts."""
    if size < 1:
        return f"--tensor-parallel must be >= 1, got {size}"
    if q_heads % size:
        return f"--tensor-parallel {size} does not divide the model's {q_heads} attention heads"
    if kv_heads >= size and kv_heads % size:
        return f"--tensor-parallel {size} does not divide the model's {kv_heads} key/value heads"
    if kv_heads < size and size % kv_heads:
        return f"--tensor-parallel {size} is not a multiple of the model's {kv_heads} key/value heads"
    for name, value in intermediate.items():
        if value % size:
            return f"--tensor-parallel {size} does not divide the model's {name} ({value})"
    return None


_INTERMEDIATE_FIELDS = ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size")


def config_problem(hf_config, size: int) -> str | None:
    """``tensor_parallel_problem`` read off a transformers config (before any process starts)."""
    text = hf_config.get_text_config()
    q_heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or q_heads
    sizes = {f: getattr(text, f) for f in _INTERMEDIATE_FIELDS if getattr(text, f, None)}
    return tensor_parallel_problem(size, q_heads, kv_heads, sizes)
