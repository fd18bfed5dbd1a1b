#!/usr/bin/env bash
# The workload search: Vanilla against nocomm on variations of
# configs/synthetic-local-gcn.toml (20k nodes, 32 communities each holding every class),
# 4 workers over loopback on a 2-core machine, seed 0 unless SEEDS says otherwise.
#   bash results/bench/modes/workload-search/search.sh NAME EPOCHS "SEEDS" OVERRIDE...
# Runs go to results/runs/workload-search/NAME-MODE-seedS/; summarise.py tabulates them.
set -euo pipefail
cd "$(dirname "$0")/../../../.."
name=$1 epochs=$2 seeds=$3
shift 3
sets=()
for item in "$@"; do sets+=(--set "$item"); done
for seed in $seeds; do
  for mode in vanilla nocomm; do
    out=results/runs/workload-search/$name-$mode-seed$seed
    OMP_NUM_THREADS=1 timeout 900 .venv/bin/python -m torch.distributed.run --standalone \
      --nproc-per-node 4 -m adaqp.train --config configs/synthetic-local-gcn.toml \
      --mode "$mode" --seed "$seed" --epochs "$epochs" --out "$out" --overwrite \
      --set checkpoint.every=0 --set metrics.progress=false --set train.eval_every=2 \
      "${sets[@]}" > /dev/null 2> "$out.log" || { echo "$name $mode $seed failed"; tail -5 "$out.log"; }
    echo "$name $mode seed $seed: $(grep -o '"test_acc": [0-9.]*' "$out/summary.json" 2>/dev/null)"
  done
done
