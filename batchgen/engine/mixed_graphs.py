"""Which steps with new prompts replay a CUDA graph (small models).

A step that starts new prompts (or runs a prompt's chunk beside decodes) has a token count that changes
from step to step, so no decode graph fits it. Eagerly, a small model's such step is bound by its host
launch: the embedded model's hundreds of kernels take the host several times as long to launch as
the GPU takes to run them. Padded to a
token bucket, the step is graph-capturable (``cuda_slots.fill_host``: padding tokens write no KV,
padding sequences have no query rows), with its sequences and samples padded to
``cuda_slots.mixed_shape``.

Padding costs GPU time (up to 1.5x the tokens, and the LM head and sampling over the padded rows), which
pays only when the launch, not the GPU, sets the step's time. So a bucket's first uses run eagerly at its
padded shape, as its graph would run, and the runner reports their host launch and GPU busy times here:
after ``MIN_RUNS`` of them the bucket is judged launch-bound (GPU busy no longer than ``HOST_BOUND`` x the
launch: it may get a graph) or GPU-bound (it runs eagerly at each step's own shape from then on: a large
model's prefill chunks). The judgement is checked once the graph replays: a replay barely faster on the
GPU than the eager runs means the launch was never the bound (the host's launch time can include waits
on the device), and the bucket goes back to eager. Pure Python: the CUDA runner measures, this decides.
"""

from __future__ import annotations

import bisect
import statistics

from batchgen.engine.admission import HOST_BOUND

MIN_RUNS = 3  # eager runs (then replays) of a bucket measured before it is judged (a process's first is slow)
NO_GAIN = 0.8  # a replay busier than this x the eager runs' GPU time gained nothing from the graph


def token_buckets(max_tokens: int) -> list[int]:
    """Token counts a step with new prompts pads to: powers of two and 1.5x between, up to the budget."""
    sizes, size = [], 16
    while size < max_tokens:
        sizes += [size, size * 3 // 2]
        size *= 2
    return sorted({s for s in sizes if s < max_tokens} | {max_tokens})


def bucket_for(buckets: list[int], size: int) -> int:
    """The smallest of the sorted ``buckets`` that holds ``size``; 0 when none does."""
    i = bisect.bisect_left(buckets, size)
    return buckets[i] if i < len(buckets) else 0


class MixedGraphs:
    """Per token bucket: measuring, graphed, or eager (the step's own shape).

    ``forced``: True graphs every bucket without measuring, False none (tensor parallelism: every rank
    must capture the same graphs at the same step, and their measures differ); None decides by measure.
    """

    def __init__(self, buckets: list[int], forced: bool | None = None) -> None:
        self.buckets = buckets if forced is not False else []
        self.forced = forced
        self._runs: dict[int, list[tuple[float, float]]] = {}  # bucket -> [(launch ms, busy ms)] eager
        self._replays: dict[int, list[float]] = {}  # bucket -> [busy ms] of its graph's replays
        self._graphed: set[int] = set()  # buckets judged bound by their launch
        self._eager: set[int] = set()  # buckets judged bound by the GPU's work

    def bucket(self, num_tokens: int) -> int:
        """The token bucket a step of ``num_tokens`` pads to; 0: it runs eagerly at its own shape."""
        if self.forced is False:
            return 0
        bucket = bucket_for(self.buckets, num_tokens)
        return 0 if bucket in self._eager else bucket

    def may_capture(self, bucket: int) -> bool:
        return self.forced is True or (self.forced is None and bucket in self._graphed)

    def ran_eager(self, bucket: int, launch_ms: float, busy_ms: float) -> None:
        runs = self._runs.setdefault(bucket, [])
        if self.forced is not None or len(runs) >= MIN_RUNS:  # judged (or never): nothing to keep
            return
        runs.append((launch_ms, busy_ms))
        if len(runs) < MIN_RUNS:
            return
        bound_by_launch = statistics.median(busy / max(launch, 1e-6) for launch, busy in runs) <= HOST_BOUND
        (self._graphed if bound_by_launch else self._eager).add(bucket)

    def replayed(self, bucket: int, busy_ms: float) -> None:
        """A replay's GPU time: no faster than the eager runs' means the graph only added padding."""
        replays = self._replays.setdefault(bucket, [])
        if self.forced is not None or len(replays) >= MIN_RUNS or bucket not in self._runs:
            return
        replays.append(busy_ms)
        if len(replays) < MIN_RUNS:
            return
        eager_busy = statistics.median(busy for _, busy in self._runs[bucket])
        if statistics.median(replays) > NO_GAIN * eager_busy:
            self._graphed.discard(bucket)
            self._eager.add(bucket)
