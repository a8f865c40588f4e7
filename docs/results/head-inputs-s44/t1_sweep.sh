#!/bin/bash
# T = 1 labels: validation AUROC / KL of heads with and without the draft's state, four splits.
set -e
DATA=runs/s44/t1/data
while read -r name inputs args; do
  for seed in 0 1 2 3; do
    out=runs/s44/t1/sweep/$name-s$seed
    mkdir -p runs/s44/t1/sweep
    [ -f $out/metrics.json ] || acchead-train --data $DATA --w-rej 6 --depth 3 --inputs $inputs --width 32 \
      --seed $seed --out $out --no-progress --threads 2 $args > $out.log 2>&1 || { cat $out.log; exit 1; }
    python -c "import json; m=json.load(open('$out/metrics.json')); print('$name', $seed, round(m['val']['auroc'],4), round(m['val']['kl'],4))"
  done
done <<RECIPES
state-e24 state+logq+entropy+topk --epochs 24
stats-e24 logq+entropy+topk --epochs 24
stats-e64 logq+entropy+topk --epochs 64
stats-e128 logq+entropy+topk --epochs 128
RECIPES
