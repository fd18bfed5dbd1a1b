#!/usr/bin/env bash
# Epoch time of a 200k-node synthetic GCN (configs/synthetic-gcn.toml at 200k nodes), one
# worker, comm.threads=1 against the default (comm.threads=0: every usable core), in
# alternating rounds so that both see the same machine load. Run from the checkout.
set -u
common=(configs/synthetic-gcn.toml --epochs 5 --set data.synthetic.num_nodes=200000
  --set train.eval_every=5 --set metrics.progress=false --set checkpoint.every=0
  --set partition.dir=/tmp/threads-parts)
for round in 1 2 3; do
  for t in 1 0; do
    NPROC=1 bash launch/train.sh "${common[@]}" --set comm.threads=$t \
      --out "/tmp/threads-r$round-t$t" --overwrite 2>&1 | tail -1
  done
done
