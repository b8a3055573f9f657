"""``batchgen bench`` and ``python -m batchgen.bench``: the benchmark workloads from the command line
(``make bench``, ``scripts/gpu_check.sh``). The one definition of its options."""

from __future__ import annotations

import json
import os
import sys

import click


@click.command("bench")
@click.option("--workload", "workloads", multiple=True, help="B1 B1s B2 B3 B4 B5 B6, repeatable [B4]")
@click.option(
    "--mode",
    "modes",
    multiple=True,
    type=click.Choice(["async", "sync", "run", "generate_batch", "hf_loop", "hf_padded", "hf_forward"]),
    help="repeatable [async sync; B4: run, the plain batchgen run command]",
)
@click.option(
    "--out", "out_dir", type=click.Path(file_okay=False), help="Write bench.json and bench.md here."
)
@click.option("--quick", is_flag=True, help="Shorter decodes, for smoke runs.")
@click.option("--no-compare-hf", "compare_hf", is_flag=True, flag_value=False, default=True,
              help="Skip transformers' generate_batch baseline.")  # fmt: skip
@click.option("--device", help="Override every workload's device (cuda, cpu, cuda:1).")
@click.option("--tensor-parallel", type=click.IntRange(min=1), help="Override every workload's GPU count.")
@click.option("--quantization", type=click.Choice(["fp8"]), help="batchgen's runs: FP8 projections.")
@click.option("--kv-cache-dtype", type=click.Choice(["auto", "fp8"]), default="auto", show_default=True,
              help="batchgen's runs: the KV cache's dtype.")  # fmt: skip
@click.option(
    "--threads", type=click.IntRange(min=1), help="B4: CPU threads of both commands [each its default]."
)
@click.option("--prompts", type=click.Path(dir_okay=False, exists=True),
              help="B4: a JSONL prompt file instead of the built-in mixed-length prompts.")  # fmt: skip
@click.option(
    "--repeat", type=click.IntRange(min=1), default=1, show_default=True, help="B4: side-by-side rounds."
)
@click.option("--max-num-seqs", type=click.IntRange(min=1),
              help="batchgen's runs: rows decoded together [the engine's choice].")  # fmt: skip
@click.option("--max-batch-tokens", type=click.IntRange(min=1),
              help="batchgen's runs: tokens a step [the engine's default].")  # fmt: skip
@click.option(
    "--sampling", type=json.loads, help="batchgen's requests: more SamplingParams, '{\"min_p\": 0.1}'."
)
def bench_command(workloads, modes, out_dir, quick, compare_hf, device, **kw) -> None:
    """The benchmark workloads (B1-B6): batchgen async and sync beside transformers (generate_batch, or
    its forward on batchgen's engine for the MoE workload B6; B4: whole commands)."""
    from batchgen.bench.harness import CommandOptions, run_bench
    from batchgen.bench.workloads import WORKLOADS

    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        raise click.BadParameter(
            f"{unknown[0]!r}; choose from {', '.join(WORKLOADS)}", param_hint="--workload"
        )
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    opts = CommandOptions(kw["threads"], kw["prompts"], kw["repeat"])
    records = run_bench(
        list(workloads) or ["B4"],
        list(modes),
        out_dir,
        quick,
        compare_hf,
        device,
        kw["tensor_parallel"],
        kw["quantization"],
        kw["kv_cache_dtype"],
        opts,
        kw["sampling"],
        max_num_seqs=kw["max_num_seqs"],
        max_batch_tokens=kw["max_batch_tokens"],
    )
    sys.exit(1 if any(failed(r) for r in records) else 0)


def failed(record: dict) -> bool:
    """A batchgen run that failed or lost tokens. A failing baseline is reported, not fatal: it is
    transformers' code, and the table already says why."""
    if record["mode"] not in ("async", "sync", "run", "-"):
        return False
    return bool(record.get("error")) or record.get("output_tokens") != record.get("expected_tokens")
