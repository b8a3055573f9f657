#!/usr/bin/env bash
# B2's FP8 decode graph steps take ~11.2 ms in the whole run against ~10.3 ms in bench_step at the same
# shape (256 x 768), and neither the run's 100 GB pool nor the power cap explains it (docs/kernels.md).
# Both under Nsight Systems (kernels inside graphs traced as nodes): each kernel's average time side by
# side (scripts/kernel_sums.py), and the SM clock and power sampled while each ran.
#   bash scripts/b2_why.sh OUTDIR      (gpu_check.sh: STAGES=b2-why)
set -uo pipefail
OUT="${1:?usage: scripts/b2_why.sh OUTDIR}"
PY="${PY:-python3}"
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -n 1)
[ -n "$NSYS" ] || { echo "nsys: not found"; exit 1; }
REPS=$(mktemp -d)  # the reports hold every kernel of ~2000 steps: not for the device tool's return
trap 'rm -rf "$REPS"' EXIT
FP8="--quantization fp8 --kv-cache-dtype fp8"

profile() {  # NAME CMD...: the command under nsys with nvidia-smi sampling beside it
    local name="$1"
    shift
    nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader,nounits -lms 500 \
        >"$OUT/smi-$name.csv" &
    local smi=$!
    "$NSYS" profile -t cuda --cuda-graph-trace=node -f true -o "$REPS/$name" "$@"
    kill "$smi" && wait "$smi" 2>/dev/null
    "$NSYS" stats -q --report cuda_gpu_kern_sum --format csv -o "$OUT/$name" "$REPS/$name.nsys-rep" >/dev/null
    # busy samples only (power over 300 W): their mean SM clock and power
    awk -F', *' '$2 > 300 { c += $1; p += $2; n++ } END { if (n) printf "%s: %d busy samples, SM %.0f MHz, %.0f W\n", name, n, c / n, p / n
        else printf "%s: no sample over 300 W\n", name }' \
        name="$name" "$OUT/smi-$name.csv"
}

# shellcheck disable=SC2086
profile step "$PY" scripts/bench_step.py --preset B2 --impl batchgen $FP8 --steps 300
# shellcheck disable=SC2086
profile run "$PY" -m batchgen.bench --workload B2 --mode async --no-compare-hf $FP8 --out "$OUT/b2"
"$PY" scripts/kernel_sums.py "$OUT/step_cuda_gpu_kern_sum.csv" "$OUT/run_cuda_gpu_kern_sum.csv"
