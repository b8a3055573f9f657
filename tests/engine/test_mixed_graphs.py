"""Which steps with new prompts replay a graph of their token bucket (engine/mixed_graphs.py): the bucket
a step pads to, and the choice from each bucket's eager runs (launch-bound: graph; GPU-bound: eager at the
step's own shape). The replays themselves run in make gpu-check (tests/engine/test_cuda_runner.py)."""

from __future__ import annotations

from batchgen.engine.mixed_graphs import MIN_RUNS, MixedGraphs, token_buckets


def test_token_buckets_step_by_at_most_1_5x_up_to_the_budget():
    buckets = token_buckets(8192)
    assert buckets[:6] == [16, 24, 32, 48, 64, 96] and buckets[-3:] == [4096, 6144, 8192]
    assert all(b / a <= 1.5 for a, b in zip(buckets, buckets[1:], strict=False))
    assert token_buckets(1000)[-2:] == [768, 1000]  # the budget itself is the last bucket
    assert token_buckets(16) == [16]


def test_a_step_pads_to_the_smallest_bucket_that_holds_it():
    graphs = MixedGraphs(token_buckets(512))
    assert [graphs.bucket(n) for n in (1, 16, 17, 300, 512)] == [16, 16, 24, 384, 512]
    assert graphs.bucket(513) == 0  # over the budget (never scheduled): eager


def test_launch_bound_buckets_get_graphs_gpu_bound_ones_run_at_their_own_shape():
    graphs = MixedGraphs(token_buckets(8192))
    for _ in range(MIN_RUNS - 1):
        graphs.ran_eager(384, 15.0, 14.0)  # a small model: the GPU waited for the launch
        graphs.ran_eager(8192, 16.0, 200.0)  # a large model's prefill: the launch hid behind the work
    assert not graphs.may_capture(384) and not graphs.may_capture(8192)  # too few runs to judge
    assert graphs.bucket(8000) == 8192  # meanwhile: padded, as its graph would run
    graphs.ran_eager(384, 400.0, 390.0)  # the process's first eager step (Triton's start)
    graphs.ran_eager(8192, 16.0, 200.0)
    assert graphs.may_capture(384) and graphs.bucket(300) == 384
    assert not graphs.may_capture(8192) and graphs.bucket(8000) == 0  # eager at its own shape from now


def test_a_graph_no_faster_on_the_gpu_than_its_eager_runs_goes_back_to_eager():
    """The host's launch time can include waits on the device (a full launch queue behind a long step):
    a bucket judged launch-bound whose replays keep the eager runs' GPU time gained only padding."""
    graphs = MixedGraphs(token_buckets(8192))
    for bucket in (384, 1024):
        for _ in range(MIN_RUNS):
            graphs.ran_eager(bucket, 20.0, 18.0)
        assert graphs.may_capture(bucket)
    for _ in range(MIN_RUNS):
        graphs.replayed(384, 2.5)  # the launch was the bound: the replay is much shorter
        graphs.replayed(1024, 17.0)  # the GPU was the bound all along
    assert graphs.may_capture(384) and graphs.bucket(300) == 384
    assert not graphs.may_capture(1024) and graphs.bucket(1000) == 0
    for _ in range(100):  # judged: a long run's steps are not all kept
        graphs.ran_eager(384, 20.0, 18.0)
        graphs.replayed(384, 2.5)
    assert len(graphs._runs[384]) == len(graphs._replays[384]) == MIN_RUNS


def test_forced_on_graphs_every_bucket_forced_off_none():
    forced = MixedGraphs(token_buckets(64), forced=True)
    for _ in range(MIN_RUNS):
        forced.replayed(32, 100.0)  # never measured against: forced stays on
    assert forced.may_capture(32) and forced.bucket(30) == 32
    off = MixedGraphs(token_buckets(64), forced=False)  # tensor parallelism
    assert off.bucket(30) == 0
    forced.forced = False  # switched off after construction (a test's runner): off as well
    assert forced.bucket(30) == 0 and not forced.may_capture(32)
