#!/usr/bin/env bash
# One seed of one suite on the README cluster's workload (GCN on
# configs/cluster-synthetic-signal-gcn.toml, 4 emulated hosts of half a core), each mode
# a run of its own, laid out as `bench cluster` lays them out
# (results/runs/bench-SUITE/<mode>-seed<k>/), so that tta.py reads them. Unlike `bench
# cluster` it runs without Vanilla, whose accuracy, the target, is the same on every
# cluster (it is exact) and comes from the converged suite. Run as root from the
# repository root:
#   bash results/bench/cluster/signal-300mbit-gcn-converged/recipe_runs.sh \
#       SUITE BANDWIDTH RECIPE EPOCHS MODES SEED
# RECIPE: old   (lr 0.01, no warm-up, every row computed: the benchmark before issue 52)
#         tuned (lr 0.05, 10 epochs of warm-up, only the loss's rows: SIGNAL_RECIPES)
# MODES: comma-separated among vanilla, adaqp, onebit-s1, nocomm.
set -euo pipefail
suite=$1 bandwidth=$2 recipe=$3 epochs=$4 modes=$5 seed=$6
py=${PYTHON:-.venv/bin/python}
case $recipe in
  old) recipe_flags=(--set train.lr=0.01 --set train.lr_warmup_epochs=0 --set train.compute_rows=all) ;;
  tuned) recipe_flags=(--set train.lr=0.05 --set train.lr_warmup_epochs=10 --set train.compute_rows=loss) ;;
  *) echo "unknown recipe: $recipe (old or tuned)" >&2; exit 2 ;;
esac
IFS=, read -ra mode_list <<< "$modes"
for mode in "${mode_list[@]}"; do
  case $mode in
    vanilla | adaqp | nocomm) flags=(--mode "$mode") ;;
    onebit-s1) flags=(--mode onebit --set staleness.bound=1) ;;
    *) echo "unknown mode: $mode" >&2; exit 2 ;;
  esac
  out=results/runs/bench-$suite/$mode-seed$seed
  mkdir -p "$out/logs"
  started=$SECONDS
  "$py" -m adaqp.cluster --hosts 4 --cpus-per-host 0.5 --bandwidth "$bandwidth" \
    --timeout 3600 --log-dir "$out/logs" --overwrite -- \
    --config configs/cluster-synthetic-signal-gcn.toml "${flags[@]}" --seed "$seed" \
    --epochs "$epochs" --out "$out" --overwrite \
    --set checkpoint.every=0 --set "partition.dir=partitions/bench-$suite" \
    --set metrics.progress=false --set train.eval_every=4 "${recipe_flags[@]}" \
    > "$out/logs/driver.log" 2>&1
  echo "$suite $mode seed $seed: done in $((SECONDS - started)) s"
done
