"""What a step asks of its sampler, as plain values (no torch): the batch builder makes them on the host,
the sampler (``sampler.py``) and the per-row device statistics (``row_tokens.py``) read them."""

from __future__ import annotations

from typing import NamedTuple

from batchgen.config import SamplingParams

# Sparse adjustments a row may have: its logit_bias entries plus its EOS and stop token ids.
MAX_ADJUSTMENTS = 1024


class SamplingFeatures(NamedTuple):
    """What a step's sampler computes (part of a captured graph's key); each part is on when some sampled
    row uses it, so rows that use none of them pay nothing."""

    sampling: bool = False  # a row samples (temperature > 0): temperature, min-p, noise
    truncation: bool = False  # a sampling row cuts by top-k or top-p (a sort of its logits)
    logprobs: bool = False  # a row wants its sampled tokens' log-probabilities
    top_logprobs: bool = False  # ... and the MAX_LOGPROBS most likely tokens' (cut per row on the host)
    penalties: bool = False  # repetition, presence or frequency penalties (``RowTokens`` counts)
    adjustments: bool = False  # logit bias, min_tokens (``RowTokens`` sparse adjustments)

    @property
    def stateful(self) -> bool:
        """Reads per-row statistics on the device (``row_tokens.RowTokens``)."""
        return self.penalties or self.adjustments


GREEDY = SamplingFeatures()  # a step whose rows are all greedy and ask for nothing more


class RowInit(NamedTuple):
    """A row whose device statistics are rebuilt before the step that first samples for it."""

    row: int
    prompt: list[int]  # the prompt's token ids
    output: list[int]  # output token ids known so far (a preempted request resuming)
    adjustments: tuple[tuple[int, float, bool], ...]  # (token id, added to its logit, only before min_tokens)


def features_of(params: SamplingParams) -> SamplingFeatures:
    """The features of a step whose rows are all sampled like ``params`` (graphs captured ahead)."""
    sampling = not params.greedy
    return SamplingFeatures(
        sampling=sampling,
        truncation=sampling and (params.top_k > 0 or params.top_p < 1),
        logprobs=params.logprobs is not None,
        top_logprobs=bool(params.logprobs),
        penalties=params.penalized,
        adjustments=params.adjusted,
    )
