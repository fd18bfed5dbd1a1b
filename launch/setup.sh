#!/usr/bin/env bash
# Creates .venv and installs AdaQP into it (editable). With --test, also the test extras.
#
#   bash launch/setup.sh          # runtime only
#   bash launch/setup.sh --test   # plus pytest, ruff and torch-geometric (for the PyG adapter test)
#
# TORCH_SPEC picks the torch build (default torch==2.13.0; on a CUDA machine install the
# matching wheel first, e.g. TORCH_SPEC="torch --index-url ..."). PYTHON picks the interpreter.
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
VENV="${VENV:-.venv}"
extras=""
if [[ "${1:-}" == "--test" ]]; then
  extras="[test,pyg]"
fi

if [[ ! -x "$VENV/bin/python" ]]; then
  "$PYTHON" -m venv "$VENV"
fi
pip=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
# torch first and by exact version: a bare "torch" requirement may pull a multi-GB build.
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  # shellcheck disable=SC2086
  "${pip[@]}" $TORCH_SPEC
fi
"${pip[@]}" -e ".${extras}"
echo "setup done: $("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)')"
