#!/usr/bin/env bash
# Creates .venv and installs AdaQP into it (editable). With --test, also the test extras;
# with --bench, matplotlib for the benchmarks' plots.
#
#   bash launch/setup.sh          # runtime only
#   bash launch/setup.sh --test   # plus pytest, ruff, matplotlib, kaminpar and torch-geometric
#   bash launch/setup.sh --bench  # plus matplotlib (the [bench] extra)
#   bash launch/setup.sh --print-torch-spec   # the torch build it would install, and stop
#   bash launch/setup.sh --help
#
# The torch build: on a machine with an NVIDIA driver, torch==2.13.0 (the CUDA build); on
# one without, the CPU build torch==2.13.0+cpu (about a quarter of the size: the CUDA
# build's NVIDIA libraries are most of a 5.2 GB .venv). The CPU build is looked for in the
# package index and in PyTorch's CPU index (TORCH_CPU_INDEX, default
# https://download.pytorch.org/whl/cpu, as PyTorch's install instructions do), which is
# asked with a short timeout and no retries: out of reach, it costs seconds. Where neither
# has it, setup says so and installs torch==2.13.0. TORCH_SPEC overrides the choice (e.g.
# TORCH_SPEC="torch==2.13.0 --index-url ..." for a given CUDA version). PYTHON picks the
# interpreter, VENV the directory.
#
# Last, setup compiles the CPU kernels (numba), which numba caches beside their source
# (adaqp/quant/__pycache__): otherwise the first training run waits for them (up to a minute).
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
TORCH_VERSION="2.13.0"
INDEX_TIMEOUT_S=10
VENV="${VENV:-.venv}"
TORCH_CPU_INDEX="${TORCH_CPU_INDEX-https://download.pytorch.org/whl/cpu}"

has_nvidia_driver() {
  [[ -e /proc/driver/nvidia/version ]] || { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }
}

# The spec to install, the index to ask besides the package index (may be empty), and the
# spec to fall back to if neither has it (may be empty).
index=""
if [[ -n "${TORCH_SPEC:-}" ]]; then
  fallback=""
elif has_nvidia_driver; then
  TORCH_SPEC="torch==$TORCH_VERSION"
  fallback=""
else
  TORCH_SPEC="torch==$TORCH_VERSION+cpu"
  index="$TORCH_CPU_INDEX"
  fallback="torch==$TORCH_VERSION"
fi

usage() {
  cat <<EOF
usage: bash launch/setup.sh [--test] [--bench]
       bash launch/setup.sh --print-torch-spec | --help

Creates a virtual environment (VENV, default .venv) and installs AdaQP into it, editable,
with torch $TORCH_VERSION: the CUDA build where there is an NVIDIA driver, else the CPU build.

options:
  --test              also the test extras: pytest, ruff, matplotlib, kaminpar,
                      torch-geometric
                      (.[test,pyg]: what the test suite needs)
  --bench             also matplotlib, for the benchmarks' plots (.[bench])
  --print-torch-spec  print the torch requirement it would install, and stop
  -h, --help          show this help and exit

environment:
  TORCH_SPEC  the torch requirement to install instead of the one chosen here
              ($TORCH_SPEC${fallback:+, else $fallback}), e.g. for a given CUDA version
              TORCH_SPEC="torch==$TORCH_VERSION --index-url https://download.pytorch.org/whl/cu126"
  TORCH_CPU_INDEX
              where the CPU build is looked for besides the package index, with a
              ${INDEX_TIMEOUT_S} s timeout (default https://download.pytorch.org/whl/cpu; empty: none)
  PYTHON      the interpreter that creates the environment (default python3)
  VENV        the environment's directory (default .venv)
EOF
}

extras=()
for arg in "$@"; do
  case "$arg" in
    -h | --help)
      usage
      exit 0
      ;;
    --print-torch-spec)
      echo "$TORCH_SPEC${index:+ --extra-index-url $index}${fallback:+ (else $fallback)}"
      exit 0
      ;;
    --test) extras+=(test pyg) ;;
    --bench) extras+=(bench) ;;
    *)
      echo "setup.sh: unknown option ${arg} (use --test, --bench, --print-torch-spec or --help)" >&2
      exit 2
      ;;
  esac
done
extras_spec=""
if [[ ${#extras[@]} -gt 0 ]]; then
  extras_spec="[$(IFS=,; echo "${extras[*]}")]"
fi

# One line before each step: pip is quiet, and the steps take minutes the first time.
if [[ ! -x "$VENV/bin/python" ]]; then
  echo "creating the virtual environment $VENV ($PYTHON -m venv)..."
  "$PYTHON" -m venv "$VENV"
fi
pip=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
# torch first and by exact version: a bare "torch" requirement may pull a multi-GB build.
if "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  echo "torch is installed in $VENV already: kept"
else
  echo "installing $TORCH_SPEC into $VENV${index:+, looked for at $index too}: the" \
    "largest download, minutes the first time..."
  # PyTorch's index is asked for torch alone (--no-deps; torch's dependencies come from the
  # package index with AdaQP's below), so that one out of reach is waited on once, briefly.
  asked=()
  if [[ -n "$index" ]]; then
    asked=(--no-deps --extra-index-url "$index" --timeout "$INDEX_TIMEOUT_S" --retries 0)
  fi
  # shellcheck disable=SC2086
  if ! "${pip[@]}" ${asked[@]+"${asked[@]}"} $TORCH_SPEC; then
    if [[ -z "$fallback" ]]; then
      echo "setup.sh: could not install $TORCH_SPEC" >&2
      exit 1
    fi
    echo "setup.sh: found no $TORCH_SPEC in the package index${index:+ or at $index}" \
      "(no NVIDIA driver here, so the CPU build was tried); installing $fallback, which" \
      "may be the multi-GB CUDA build. For the CPU build, set PIP_EXTRA_INDEX_URL (or" \
      "TORCH_CPU_INDEX) to an index with it that this machine reaches." >&2
    echo "installing $fallback into $VENV..."
    "${pip[@]}" "$fallback"
  fi
fi
echo "installing AdaQP (editable) into $VENV with numpy, scipy, pymetis, ogb, tqdm and" \
  "numba${extras_spec:+, and the extras $extras_spec}..."
"${pip[@]}" -e ".${extras_spec}"
echo "compiling the CPU kernels (numba; once, up to a minute)..."
if ! "$VENV/bin/python" -c "from adaqp.quant import kernels; kernels.warm_up(parallel=True)"; then
  echo "setup.sh: could not compile the CPU kernels now; the first training run will" >&2
fi
echo "setup done: $("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)'), $VENV $(du -sh "$VENV" | cut -f1)"
