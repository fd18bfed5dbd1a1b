#!/usr/bin/env bash
# Starts AdaQP training under torchrun, on one machine or many.
#
#   bash launch/train.sh [CONFIG] [train flags...]
#   NPROC=4 bash launch/train.sh configs/cora-gcn.toml --mode vanilla --epochs 200
#
# Without --out the run goes to adaqp.train's default directory and replaces the run
# there (--overwrite), as repeated launches always have; with --out, --overwrite or
# --resume, adaqp.train refuses to replace a finished run unless told to.
#
# Multi-node: run the same command on every host with NNODES, NODE_RANK, MASTER_ADDR
# (host 0's address) and MASTER_PORT set; GLOO_SOCKET_IFNAME names the network interface.
set -euo pipefail

cd "$(dirname "$0")/.."
NPROC="${NPROC:-4}"
NNODES="${NNODES:-1}"
NODE_RANK="${NODE_RANK:-0}"
MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"
MASTER_PORT="${MASTER_PORT:-29500}"
CONFIG="${1:-configs/cora-gcn.toml}"
[[ $# -gt 0 ]] && shift

PY=python3
[[ -x .venv/bin/python ]] && PY=.venv/bin/python
# Keep P workers on few cores from thrashing; the trainer splits cores among local workers.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# Workers stop within a second of SIGTERM; a stopped or hung one is killed after this
# many seconds instead of torchrun's default 30 once the run has failed.
export TORCH_ELASTIC_SHUTDOWN_TIMEOUT="${TORCH_ELASTIC_SHUTDOWN_TIMEOUT:-5}"
# RESTARTS > 0: a lost worker restarts the group, which resumes from the last checkpoint.
RESTARTS="${RESTARTS:-0}"

if [[ "$NNODES" == "1" ]]; then
  rdzv=(--standalone)
else
  rdzv=(--nnodes "$NNODES" --node-rank "$NODE_RANK" --rdzv-backend c10d
        --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" --rdzv-id "${RDZV_ID:-adaqp}")
fi
# Only the default directory is replaced: an --out chosen on the command line or in the
# config file ([metrics] out, the only key named out) keeps adaqp.train's protection.
replace=(--overwrite)
if grep -qsE '^[[:space:]]*out[[:space:]]*=' "$CONFIG"; then replace=(); fi
for arg in "$@"; do
  case "$arg" in
    --out | --out=* | metrics.out=* | --set=metrics.out=* | --overwrite | --resume) replace=() ;;
  esac
done
exec "$PY" -m torch.distributed.run "${rdzv[@]}" --nproc-per-node "$NPROC" \
  --max-restarts "$RESTARTS" \
  -m adaqp.train --config "$CONFIG" "${replace[@]}" "$@"
