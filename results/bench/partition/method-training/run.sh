#!/usr/bin/env bash
# Trains Cora and CiteSeer (GCN, 4 workers, 100 epochs) on METIS and KaMinPar partitions, in
# vanilla, adaqp (default: float32 within a host), adaqp with every message quantized, and
# nocomm, after the others. Seeds interleaved so machine noise spreads evenly.
# Usage, from the checkout: bash results/bench/partition/method-training/run.sh [RUNS_DIR]
set -euo pipefail
RUNS="${1:-/tmp/method-training}"
SEEDS="${SEEDS:-0 1 2}"
EPOCHS="${EPOCHS:-100}"
train() {  # dataset method mode-label seed extra-args...
    local data=$1 method=$2 label=$3 seed=$4; shift 4
    local out="$RUNS/$data-$method-$label-s$seed"
    [[ -f "$out/summary.json" ]] && return 0
    bash launch/train.sh "configs/$data-gcn.toml" --epochs "$EPOCHS" --seed "$seed" \
        --set "partition.method=$method" --out "$out" --overwrite "$@" >"$out.log" 2>&1 \
        || { echo "failed: $out (see $out.log)"; return 1; }
    echo "done: $out"
}
mkdir -p "$RUNS"
for seed in $SEEDS; do
    for data in cora citeseer; do
        for method in metis kaminpar; do
            train "$data" "$method" vanilla "$seed" --mode vanilla
            train "$data" "$method" adaqp "$seed" --mode adaqp
            train "$data" "$method" adaqp-quantized "$seed" --mode adaqp \
                --set quant.full_precision=never
        done
    done
done
for seed in $SEEDS; do
    for data in cora citeseer; do
        for method in metis kaminpar; do
            train "$data" "$method" nocomm "$seed" --mode nocomm
        done
    done
done
