"""The sampler over a vocabulary split across ranks picks what the one-process sampler picks over the whole
vocabulary. The ranks run as threads of this process, their gathers met at a barrier, so each rank sees
only its own share of the logits, as it would in its own process."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import torch

from batchgen.distributed.shard import Span, vocab_span
from batchgen.engine.sampler import SamplingTensors, sample
from batchgen.engine.sharded_sampler import ShardedSampler
from batchgen.engine.step_sampling import SamplingFeatures
from tests.engine.sampling_cases import tensors


class _ThreadRanks:
    """``all_gather`` for ``size`` ranks that are threads: each posts its tensor, all wait, all read."""

    def __init__(self, size: int) -> None:
        # A timeout: a rank that fails before its gather must not leave the others waiting forever.
        self.size, self._posted, self._barrier = size, [None] * size, threading.Barrier(size, timeout=30)
        self.gathered: list[torch.dtype] = []  # the dtype of each tensor posted

    def group(self, rank: int):
        ranks = self

        class _Group:
            size = ranks.size

            def all_gather(self, x: torch.Tensor) -> torch.Tensor:
                ranks._posted[rank] = x.clone()
                ranks.gathered.append(x.dtype)
                ranks._barrier.wait()
                out = torch.stack(ranks._posted)  # [size, *x.shape]
                ranks._barrier.wait()  # every rank has read before the next gather posts
                return out

        return _Group()


def _greedy(rows: int) -> SamplingTensors:
    return tensors(rows, rng_keys=torch.arange(rows))


def _sharded(
    logits: torch.Tensor, size: int, params: SamplingTensors, features: SamplingFeatures, ranks=None
):
    vocab = logits.shape[1]
    ranks = ranks or _ThreadRanks(size)

    def run(rank: int):
        span = vocab_span(vocab, rank, size)
        sampler = ShardedSampler(ranks.group(rank), Span(span.start, span.stop), vocab)
        return sampler(logits[:, span.start : span.stop], params, features)

    with ThreadPoolExecutor(size) as pool:
        return list(pool.map(run, range(size)))


def test_greedy_over_ranks_in_bf16_picks_the_first_maximum_of_the_whole_vocabulary():
    """bf16 logits (greedy steps are not widened to float32) with ties inside a share and across the
    shares' border: every rank ends with the one-process sampler's tokens."""
    torch.manual_seed(1)
    logits = (torch.randint(-3, 4, (32, 301)).float() / 2).to(torch.bfloat16)  # [S, V]: 7 values, ties
    logits[0, 150], logits[0, 151] = 9, 9  # one row's maximum on both sides of a two-way split
    want = sample(logits.float(), _greedy(32), SamplingFeatures()).tokens
    for size in (2, 3):
        for tokens, logprobs, *_ in _sharded(logits, size, _greedy(32), SamplingFeatures()):
            assert torch.equal(tokens, want) and logprobs is None
    assert want[0].item() == 150


def test_steps_that_want_logprobs_gather_float32_logits():
    """301 tokens over 3 ranks: the last share is padded with -inf before the gather."""
    torch.manual_seed(2)
    logits = torch.randn(8, 301).to(torch.bfloat16)
    want, want_logprobs, *_ = sample(logits.float(), _greedy(8), SamplingFeatures(logprobs=True))
    ranks = _ThreadRanks(3)
    for tokens, logprobs, *_ in _sharded(logits, 3, _greedy(8), SamplingFeatures(logprobs=True), ranks):
        assert torch.equal(tokens, want) and torch.equal(logprobs, want_logprobs)
    assert ranks.gathered == [torch.float32] * 3
