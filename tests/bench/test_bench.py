"""The bench harness end to end on a tiny model (CPU), plus the parts that need no run at all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from batchgen.bench import metrics, report, whole_commands
from batchgen.bench.command import bench_command, failed
from batchgen.bench.harness import modes_for, run_bench, run_workload
from batchgen.bench.runners import base_record
from batchgen.bench.workloads import (
    RECORDS_SCHEMA,
    WORKLOADS,
    Workload,
    build_random_model,
    chat_prompts,
    load_tokenizer,
    mixed_prompts,
    quick,
    random_prompts,
    staggered_lengths,
)
from batchgen.model.tokenize import encode_prompt

REQUESTS, PROMPT, NEW = 4, 8, 8


@pytest.fixture(scope="module")
def tiny_records(tiny_llama) -> list[dict]:
    w = Workload("tiny", tiny_llama, REQUESTS, PROMPT, NEW, device="cpu", dtype="float32")
    return run_workload(w, ["async", "sync"], compare_hf=False)


# Every field a batchgen run's record has: base_record's, then the workload's (graph memory on CUDA too).
RECORD_FIELDS = {
    *base_record("sync", "batchgen", 1, 1),
    "workload",
    "shape",
    "device",
    "bandwidth_gbs",
    "load_1m",
}
MEASURED = ("wall_s", "tok_s", "cpu_ms_step", "peak_mem_gib", "roofline", "bandwidth_gbs", "load_1m")


def _check_engine_record(r: dict, workload: str, device: str) -> None:
    """A record's structure and counts. No assertion on a timing or a bandwidth (the machine's load and
    its memory system are not what a unit test checks): measured fields only have to be filled in."""
    assert set(r) >= RECORD_FIELDS, RECORD_FIELDS - set(r)
    assert (r["workload"], r["engine"], r["error"], r["errors"]) == (workload, "batchgen", None, 0)
    assert r["device"].startswith(device) and not failed(r)
    assert (r["requests"], r["max_new_tokens"]) == (REQUESTS, NEW)
    assert r["output_tokens"] == r["expected_tokens"] == REQUESTS * NEW  # ignore_eos: exact lengths
    # One prefill step for all four prompts (8 tokens each, within every budget), then one decode step
    # per further token: the timed run's steps only (warm-up excluded), in either mode.
    assert r["steps"] == NEW
    assert all(isinstance(r[k], float) for k in MEASURED), {k: r[k] for k in MEASURED}
    assert r["tok_s"] == r["output_tokens"] / r["wall_s"]
    on_gpu = device == "cuda"  # the compute stream's busy time exists only there
    assert (r["gpu_active_pct"] is not None, r["gpu_ms_step"] is not None) == (on_gpu, on_gpu)


def test_engine_modes_emit_every_token(tiny_records):
    assert [r["mode"] for r in tiny_records] == ["async", "sync"]
    for r in tiny_records:
        _check_engine_record(r, "tiny", "cpu")


def test_a_token_budget_reaches_the_engine(tiny_llama):
    """``--max-batch-tokens``: at 16 tokens a step the four 8-token prompts (32 tokens) no longer prefill in
    one step, so the run takes more than its NEW steps (``_check_engine_record``: one prefill step)."""
    w = Workload(
        "tiny", tiny_llama, REQUESTS, PROMPT, NEW, device="cpu", dtype="float32", max_batch_tokens=16
    )
    [r] = run_workload(w, ["sync"], compare_hf=False)
    assert r["max_batch_tokens"] == 16 and r["steps"] > NEW
    assert r["output_tokens"] == REQUESTS * NEW


def test_tables_render(tiny_records):
    text = report.render(tiny_records)
    rows = [line for line in text.splitlines() if line.startswith("| tiny")]
    assert len(rows) == 3  # two runs + one ratio row
    assert "4 x (8 + 8)" in rows[0] and "| 32 |" in rows[0]
    assert rows[2].count("x |") >= 1  # async / sync ratio present


def test_write_outputs(tiny_records, tmp_path):
    paths = report.write(tiny_records, tmp_path, {"command": "test"})
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["command"] == "test" and len(data["runs"]) == 2
    assert "| workload |" in (tmp_path / "bench.md").read_text()
    assert {p.name for p in paths} == {"bench.json", "bench.md"}


def test_token_mismatch_and_errors_are_visible():
    short = {"workload": "w", "shape": "s", "mode": "sync", "output_tokens": 30, "expected_tokens": 32}
    broken = {"workload": "w", "shape": "s", "mode": "generate_batch", "error": "ValueError: no | way"}
    text = report.runs_table([short, broken])
    assert "30 (want 32)" in text and "FAILED: ValueError: no / way" in text
    assert failed(short) and not failed(broken)  # a baseline's failure is reported, not fatal


def test_run_bench_reports_a_missing_device(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    records = run_bench(["B3"], ["sync"], str(tmp_path), quick=True, compare_hf=False, device=None)
    assert len(records) == 1 and "CUDA" in records[0]["error"]
    assert (tmp_path / "bench.md").exists()


def test_batchgen_bench_command(tmp_path):
    """``batchgen bench`` (SPEC's command, what ``make bench`` runs): usage errors exit 2; a run whose
    device is missing writes its tables and exits 1."""
    from click.testing import CliRunner

    from batchgen.cli import cli

    bad = CliRunner().invoke(cli, ["bench", "--workload", "B9"])
    assert bad.exit_code == 2 and "choose from B1, B1s, B2, B3, B4" in bad.output
    if torch.cuda.is_available():
        return
    flags = ["--mode", "sync", "--quick", "--no-compare-hf", "--out", str(tmp_path)]
    result = CliRunner().invoke(cli, ["bench", "--workload", "B3", *flags])
    assert result.exit_code == 1 and (tmp_path / "bench.md").exists()


def test_workload_table_and_quick():
    assert {"B1", "B1s", "B2", "B3", "B4"} <= set(WORKLOADS)
    b1 = WORKLOADS["B1"]
    assert (b1.num_requests, b1.prompt_len, b1.max_new_tokens) == (32, 256, 8192)
    q = quick(WORKLOADS["B1s"])
    assert q.max_new_tokens == 256 and q.hf_max_new_tokens <= 64
    assert quick(WORKLOADS["B4"]) == WORKLOADS["B4"]
    assert modes_for(WORKLOADS["B4"], [], True) == ["run", "generate_batch"]  # whole commands
    assert modes_for(WORKLOADS["B4"], ["sync"], False) == ["sync"]
    cpu = Workload("cpu", "x", 4, 8, 8, device="cpu")
    assert modes_for(cpu, ["sync"], True) == ["sync", "generate_batch", "hf_loop", "hf_padded"]
    assert modes_for(WORKLOADS["B3"], ["async"], True) == ["async", "generate_batch"]
    assert modes_for(WORKLOADS["B3"], [], False) == ["async", "sync"]
    assert modes_for(WORKLOADS["B6"], ["async"], True) == ["async", "hf_forward"]
    assert quick(WORKLOADS["B6"]).hf_num_requests == 64


def test_moe_workload_beside_transformers_forward(tiny_models):
    """B6's shape of comparison on a tiny MoE model: batchgen's fused forward, then transformers' forward
    on the same engine for the first requests (every token emitted by both)."""
    w = Workload("tiny-moe", tiny_models["qwen3_moe"], REQUESTS, PROMPT, NEW, device="cpu", dtype="float32",
                 baselines=("hf_forward",), hf_num_requests=2)  # fmt: skip
    fused, hf = run_workload(w, ["async"], compare_hf=True)
    assert (fused["mode"], hf["mode"]) == ("async", "hf_forward")
    assert fused["error"] is None and fused["output_tokens"] == REQUESTS * NEW
    assert hf["error"] is None and hf["output_tokens"] == hf["expected_tokens"] == 2 * NEW
    assert "transformers' forward" in hf["note"]
    assert "batchgen / hf_forward" in report.render([fused | {"workload": "w"}, hf | {"workload": "w"}])


def test_structured_output_workload_keeps_every_row_to_its_length(tiny_llama):
    """B3j's shape on the tiny model: every request under RECORDS_SCHEMA still decodes exactly
    max_new_tokens (the schema asks for more), and the host's mask time is reported."""
    w = Workload("tiny-j", tiny_llama, REQUESTS, PROMPT, NEW, device="cpu", dtype="float32",
                 json_schema=RECORDS_SCHEMA)  # fmt: skip
    (record,) = run_workload(w, ["async"], compare_hf=False)
    _check_engine_record(record, "tiny-j", "cpu")
    assert record["mask_ms_step"] > 0 and WORKLOADS["B3j"].json_schema is RECORDS_SCHEMA


def test_b4_prompts_mix_short_and_long():
    """B4's prompts as the issue describes them: most 40-60 tokens with the chat template, two long."""
    prompts = mixed_prompts()
    assert prompts == mixed_prompts()  # fixed text
    lens = sorted(len(encode_prompt(load_tokenizer(), p)) for p in prompts)
    assert len(lens) == 78 and lens[0] >= 40 and lens[-3] <= 60
    assert 480 <= lens[-2] <= 540 and 780 <= lens[-1] <= 840


def test_whole_commands_side_by_side(tiny_llama, tmp_path):
    """batchgen run and the generate_batch command on the same prompt file, each a timed process."""
    path = whole_commands.write_prompts(
        ["Say hi.", [{"role": "user", "content": "Count to three."}]], tmp_path / "p.jsonl"
    )
    assert whole_commands.read_prompts(str(path))[1] == [{"role": "user", "content": "Count to three."}]
    for mode in ("run", "generate_batch"):
        r = whole_commands.run_command(
            mode, path, 2, 4, threads=1, target=whole_commands.Target(model=tiny_llama)
        )
        assert r["error"] is None, r["error"]
        assert r["output_tokens"] == r["expected_tokens"] == 8  # EOS ignored / disabled in both
        assert r["wall_s"] > r["gen_s"] > 0 and r["peak_mem_gib"] > 0 and r["threads_used"] == "1"
        assert not failed(r)
    assert r["steps"] is None  # the baseline has no engine stats; batchgen run's come next
    run = whole_commands.run_command(
        "run", path, 2, 4, threads=1, target=whole_commands.Target(model=tiny_llama)
    )
    assert run["steps"] >= 4 and run["cpu_ms_step"] > 0 and run["gpu_active_pct"] is None  # no GPU
    start = run["startup"]  # the command's own start-up breakdown, read from its stats file
    assert 0 < start["ready_s"] <= start["first_token_s"] < run["wall_s"], start
    assert f"engine ready at {start['ready_s']:.1f} s" in run["note"]


def test_rows_with_their_own_lengths_expect_their_sum(tiny_llama):
    """B7s's per-row max_new_tokens: the run is checked against their sum, not rows x mean."""
    target = whole_commands.Target(model=tiny_llama)
    (r,) = whole_commands.run_command_workload("B7s", ["a", "b"], ["run"], 4, 1, 1, target, row_tokens=[3, 6])
    assert r["output_tokens"] == r["expected_tokens"] == 9 and not failed(r), r


def test_b7_runs_the_whole_command_and_reads_its_stats(tiny_llama):
    """B7 as the issue gives it: 8192 distinct chat prompts x 256 tokens through batchgen run alone on a
    GPU, its GPU-active share and host time per step read from the command's own stats file. The same
    path runs here on the CPU at a tiny size: a real command, its figures read back from its stats file."""
    w = WORKLOADS["B7"]
    assert (w.device, w.dtype, w.command, w.num_requests, w.max_new_tokens) == (
        "cuda",
        "bfloat16",
        True,
        8192,
        256,
    )
    assert modes_for(w, [], True) == ["run"]
    prompts = chat_prompts(8192)
    assert len(set(prompts)) == 8192
    tiny = whole_commands.Target("cpu", "float32", model=tiny_llama, flags=w.run_flags)
    (r,) = whole_commands.run_command_workload(w.name, prompts[:3], modes_for(w, [], True), 4, 1, 1, tiny)
    assert r["error"] is None and not failed(r), r
    assert (r["workload"], r["mode"], r["engine"], r["device"]) == ("B7", "run", "batchgen", "cpu")
    assert r["output_tokens"] == r["expected_tokens"] == 3 * 4  # --ignore-eos: every row its 4 tokens
    # The engine's own figures, from the stats file: one prefill step for the three rows, then a decode
    # step per further token; no device stream on the CPU, so no GPU-active share.
    assert r["steps"] == 4 and r["cpu_ms_step"] > 0
    assert r["gpu_active_pct"] is None and r["gpu_ms_step"] is None
    assert set(r["gc"]) == {"collections", "total_ms", "longest_ms", "by_generation"}  # the run's pauses
    assert 0 < r["gen_s"] < r["wall_s"] and "engine ready at" in r["note"]
    # A whole command of 30 s whose engine ran 2 s: GPU-active is over the engine's own time.
    record = {"steps": None, "cpu_ms_step": None, "gpu_active_pct": None, "gpu_ms_step": None, "wall_s": 30.0}
    engine = {"steps": 100, "wall_s": 2.0, "gpu_busy_s": 1.5, "schedule_s": 0.05, "prep_s": 0.03,
              "replay_s": 0.02, "postprocess_s": 0.02, "mask_s": 0.0}  # fmt: skip
    whole_commands._engine_stats(record, engine)
    want = {"steps": 100, "cpu_ms_step": 0.7, "prep_ms_step": 0.3, "replay_ms_step": 0.2,
            "gpu_active_pct": 75.0, "gpu_ms_step": 15.0, "wall_s": 30.0}  # fmt: skip
    assert record == pytest.approx(want)
    # B7w: the same command at 1024 rows a step.
    wide = WORKLOADS["B7w"]
    target = whole_commands.Target("cuda", wide.dtype, flags=wide.run_flags)
    argv = whole_commands._argv("run", Path("p.jsonl"), Path("o.jsonl"), 256, None, target)
    assert argv[-2:] == ["--max-num-seqs", "1024"] and wide.num_requests == w.num_requests


def test_b7s_rows_ask_their_own_lengths(tmp_path):
    """B7s: B7's prompts, each row with its own max_new_tokens (16-496, mean ~256), in the prompt file."""
    staggered = WORKLOADS["B7s"]
    assert staggered.staggered and staggered.num_requests == WORKLOADS["B7"].num_requests
    lengths = staggered_lengths(8192)
    assert (min(lengths), max(lengths)) == (16, 496) and abs(sum(lengths) / len(lengths) - 256) < 1
    path = whole_commands.write_prompts(["a", "b"], tmp_path / "p.jsonl", lengths[:2])
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["max_new_tokens"] for r in rows] == lengths[:2] and rows[0]["prompt"] == "a"


def test_ratios_use_the_median_of_repeats():
    runs = [("run", 30.0), ("run", 10.0), ("run", 20.0), ("generate_batch", 5.0)]
    records = [{"workload": "B4", "shape": "s", "mode": m, "tok_s": t} for m, t in runs]
    assert "| B4 | - | 4.00x |" in report.ratios_table(records)


def _bench_args(argv: list[str]) -> dict:
    """The options ``batchgen bench`` and ``python -m batchgen.bench`` parse ``argv`` into."""
    with bench_command.make_context("bench", argv) as ctx:
        return ctx.params


def test_cli_args(tmp_path):
    args = _bench_args(["--workload", "B1s", "--workload", "B3", "--out", "x", "--quick"])
    assert args["workloads"] == ("B1s", "B3") and args["quick"] and args["compare_hf"]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("")
    args = _bench_args(["--threads", "1", "--repeat", "3", "--prompts", str(prompts), "--mode", "run"])
    assert (args["threads"], args["repeat"], args["prompts"], args["modes"]) == (1, 3, str(prompts), ("run",))
    assert not _bench_args(["--no-compare-hf"])["compare_hf"]


def test_python_m_bench_is_the_same_command():
    """``python -m batchgen.bench`` (gpu_check.sh) runs the click command: its options, its usage errors."""
    import subprocess
    import sys

    bad = subprocess.run(
        [sys.executable, "-m", "batchgen.bench", "--workload", "B9"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "choose from B1, B1s, B2, B3, B4" in bad.stderr
    assert "python -m batchgen.bench" in bad.stderr
    help_ = subprocess.run([sys.executable, "-m", "batchgen.bench", "--help"], capture_output=True, text=True)
    assert help_.returncode == 0 and "--kv-cache-dtype" in help_.stdout


@pytest.mark.parametrize(
    ("arch", "billions", "kv_heads"),
    [("llama3-8b", 8.03, 8), ("qwen3-0.6b", 0.596, 8), ("qwen3-30b-a3b", 30.5, 4)],
)
def test_real_configs_build_on_meta(arch, billions, kv_heads):
    """The written-out configs give the real parameter counts (meta device: no memory, no time)."""
    model = build_random_model(arch, "meta", torch.bfloat16)
    params = {id(p): p for p in model.parameters()}
    assert sum(p.numel() for p in params.values()) / 1e9 == pytest.approx(billions, rel=0.01)
    sizes = metrics.model_bytes(model)
    layers = model.config.num_hidden_layers
    assert sizes["kv_per_token"] == 2 * layers * kv_heads * 128 * 2  # K and V, kv heads x 128, bf16
    # FP8: every decoder projection and routed expert at one byte a weight (the MoE: nearly all its bytes)
    share = metrics.model_bytes(model, "fp8")["weights"] / sizes["weights"]
    assert share < (0.51 if arch == "qwen3-30b-a3b" else 0.75)


def test_decode_roofline_arithmetic():
    sizes = {"weights": 1000, "kv_per_token": 10}
    # 2 waves x 3 steps x 1000 B of weights + 4 requests x 3 tokens x mean context (5 + 1) x 10 B
    assert metrics.decode_ideal_s(sizes, 4, 5, 3, 2, 1.0) == 6000 + 720


def test_random_prompts_are_fixed_length_and_in_vocab():
    prompts = random_prompts(3, 7, 500, seed=1)
    assert [len(p) for p in prompts] == [7, 7, 7]
    assert all(100 <= t < 500 for p in prompts for t in p)
    assert prompts == random_prompts(3, 7, 500, seed=1)


@pytest.mark.gpu
def test_tiny_workload_on_cuda(tiny_llama):
    w = Workload("tiny-cuda", tiny_llama, REQUESTS, PROMPT, NEW, device="cuda", dtype="bfloat16")
    records = run_workload(w, ["async", "sync"], compare_hf=False)
    assert [r["mode"] for r in records] == ["async", "sync"]
    for r in records:
        _check_engine_record(r, "tiny-cuda", "cuda")


def test_stat_deltas_survive_a_reset():
    before = dict.fromkeys(metrics.STAT_FIELDS, 0.0) | {"steps": 10, "output_tokens": 40}
    after = dict(before) | {"steps": 14, "output_tokens": 56, "gpu_busy_s": None}
    d = metrics.delta(before, after)
    assert d["steps"] == 4 and d["output_tokens"] == 16 and d["gpu_busy_s"] is None
    reset = dict(after) | {"steps": 3}  # an engine that restarts its counters per stream
    assert metrics.delta(before, reset)["steps"] == 3


def test_baseline_env_follows_the_thread_setting(monkeypatch):
    """Same threads: the same OpenMP spin for both whole_commands. Defaults: the baseline does not inherit
    what batchgen's command line set for itself; a user's own setting reaches both."""
    from batchgen import threads

    def fresh_cli_start():
        monkeypatch.setattr(threads, "DEFAULTED", set())
        monkeypatch.setattr(whole_commands, "DEFAULTED", threads.DEFAULTED)
        threads.prefer_short_spins()

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    fresh_cli_start()
    assert whole_commands._env("run", None)["GOMP_SPINCOUNT"] == "1000"
    assert whole_commands._env("generate_batch", 1)["GOMP_SPINCOUNT"] == "1000"
    assert "GOMP_SPINCOUNT" not in whole_commands._env("generate_batch", None)
    monkeypatch.delenv("GOMP_SPINCOUNT")
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # the user's choice: nothing added, for either
    fresh_cli_start()
    assert "GOMP_SPINCOUNT" not in whole_commands._env("run", None)
    assert "GOMP_SPINCOUNT" not in whole_commands._env("generate_batch", 1)
    assert whole_commands._env("generate_batch", None)["OMP_WAIT_POLICY"] == "PASSIVE"


def test_a_quantized_run_without_baselines_never_builds_the_16_bit_model(monkeypatch):
    """batchgen creates and quantizes the random weights itself (an FP8 MoE fits where its bf16 would not)."""
    import batchgen.bench.harness as harness

    def no_whole_model(*args, **kwargs):
        raise AssertionError("the 16-bit model was built")

    monkeypatch.setattr(harness, "build_random_model", no_whole_model)
    w = Workload("fp8-cpu", "smollm2-135m", 2, 4, 2, device="cpu", dtype="float32", quantization="fp8")
    records = run_workload(w, ["sync"], compare_hf=False)
    assert [r["mode"] for r in records] == ["sync"] and not records[0].get("error")
    assert records[0]["output_tokens"] == 4
