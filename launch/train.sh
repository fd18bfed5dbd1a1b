#!/usr/bin/env bash
# Starts AdaQP training under torchrun, on one machine or many, without a torchrun command
# line: a thin wrapper around `python -m adaqp.launcher` (also installed as `adaqp-train`).
#
#   bash launch/train.sh [CONFIG] [options] [train flags...]     # flags in any order
#   bash launch/train.sh --help
#   NPROC=4 bash launch/train.sh configs/cora-gcn.toml --mode vanilla --epochs 200
#   bash launch/train.sh --config configs/cora-gcn.toml --epochs 200 --resume
#
# Runs from the repository root (relative paths are taken from there), with .venv's
# python if there is one. Without --out, --overwrite or --resume the run goes to
# adaqp.train's default directory with --replace-finished: running a command again
# replaces its finished run there, never an interrupted or failed one (--resume continues
# it, --overwrite discards it). Exit codes: 0 success, 1 a failed run, 2 a usage or config
# error, 130 interrupted.
#
# Multi-node: run the same command on every host with NNODES, NODE_RANK, MASTER_ADDR
# (host 0's address) and MASTER_PORT set (or --nnodes, --node-rank, --master-addr,
# --master-port); GLOO_SOCKET_IFNAME names the network interface.
set -euo pipefail

# The command as typed, for the "--resume" hint after Ctrl-C (the launcher quotes it).
export ADAQP_LAUNCH_SCRIPT="$0"
cd "$(dirname "$0")/.."
PY=python3
[[ -x .venv/bin/python ]] && PY=.venv/bin/python
exec "$PY" -m adaqp.launcher "$@"
