#!/usr/bin/env bash
# Start-up profile at 4 and 8 emulated hosts (300 Mbit/s each, 1 worker each), the code
# before (pairs one at a time) and after (round-robin rounds), interleaved.
set -u
PY=/work/main/.venv/bin/python
for hosts in 4 8; do
  for tag in old new; do
    dir=/work/main; [ $tag = old ] && dir=/tmp/adaqp-old
    out=/tmp/su/$tag-$hosts
    rm -rf $out $out-run
    start=$(date +%s.%N)
    (cd $dir && timeout 900 $PY -m adaqp.cluster --hosts $hosts --bandwidth 300mbit --cpus-per-host 0 \
       --log-dir $out -- --config configs/cora-gcn.toml --mode adaqp --epochs 1 \
       --set quant.scheme=adaptive --set partition.dir=/tmp/su/parts-$tag-$hosts --out $out-run) > $out.stdout 2>&1
    rc=$?
    end=$(date +%s.%N)
    line=$(grep -h "profiled in" $out/host0.log | sed 's/.*links:/links:/')
    echo "$hosts hosts $tag rc=$rc job_s=$(echo "$end - $start" | bc) $line"
  done
done
