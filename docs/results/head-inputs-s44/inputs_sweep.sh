#!/bin/bash
# Validation AUROC / KL of the demo's head recipe with and without the draft's state, four splits.
set -e
DATA=${1:-runs/s42/demo-smollm2/data}
for inputs in state+logq+entropy+topk logq+entropy+topk logq+entropy topk; do
  for seed in 0 1 2 3; do
    out=runs/s44/sweep/${inputs//+/_}-s$seed
    [ -f $out/metrics.json ] || acchead-train --data $DATA --w-rej 6 --depth 3 --inputs $inputs --epochs 24 \
      --width 32 --seed $seed --out $out --no-progress --threads 2 > $out.log 2>&1 || { cat $out.log; exit 1; }
    python -c "import json,sys; m=json.load(open('$out/metrics.json')); print('$inputs', $seed, round(m['val']['auroc'],4), round(m['val']['kl'],4))"
  done
done
