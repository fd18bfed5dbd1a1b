#!/usr/bin/env bash
# Starts AdaQP training under torchrun, on one machine or many, without a torchrun command
# line: a thin wrapper around `python -m adaqp.launcher` (also installed as `adaqp-train`).
#
#   bash launch/train.sh [CONFIG] [options] [train flags...]     # flags in any order
#   bash launch/train.sh --help
#   NPROC=4 bash launch/train.sh configs/cora-gcn.toml --mode vanilla --epochs 200
#   bash launch/train.sh --config configs/cora-gcn.toml --epochs 200 --resume
#
# Runs from the repository root, with .venv's python if there is one. Paths on the command
# line are relative to the folder it is typed in; the defaults (configs/, results/runs/,
# partitions/) and paths inside a config are relative to the checkout. No run is deleted
# without --overwrite: without --out, a run whose default directory holds a run goes to
# the first free <dir>-v2, <dir>-v3, ... (--resume and --overwrite act on the newest).
# Exit codes: 0 success, 1 a failed run, 2 a usage or config error, 130 interrupted.
#
# Multi-node: run the same command on every host with NNODES, NODE_RANK, MASTER_ADDR
# (host 0's address) and MASTER_PORT set (or --nnodes, --node-rank, --master-addr,
# --master-port); GLOO_SOCKET_IFNAME names the network interface.
set -euo pipefail

# The command as typed, for the "--resume" hint after Ctrl-C (the launcher quotes it).
export ADAQP_LAUNCH_SCRIPT="$0"
# Where the command was typed: the launcher resolves the command line's paths against it.
export ADAQP_CALLER_CWD="$PWD"
cd "$(dirname "$0")/.."
PY=python3
[[ -x .venv/bin/python ]] && PY=.venv/bin/python
exec "$PY" -m adaqp.launcher "$@"
