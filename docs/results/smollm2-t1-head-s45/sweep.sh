#!/bin/bash
# Heads on the real pair's T = 1 labels that fit the ~16 kB the repo's 25 MB of weights leave beside the
# draft: the draft's statistics alone (32 wide, 9.9 kB in bf16) against the state with them, 8 wide (586
# inputs, 9.8 kB). Validation AUROC / KL over four splits (seeds 0-3).
#   bash docs/results/smollm2-t1-head-s45/sweep.sh runs/s45/t1
set -e
RUN=${1:-runs/s45/t1}
while read -r name inputs args; do
  for seed in 0 1 2 3; do
    out=$RUN/sweep/$name-s$seed
    mkdir -p $RUN/sweep
    [ -f $out/metrics.json ] || acchead-train --data $RUN/data --w-rej 6 --depth 3 --inputs $inputs \
      --seed $seed --out $out --no-progress --threads 2 $args > $out.log 2>&1 || { cat $out.log; exit 1; }
    python -c "import json; m=json.load(open('$out/metrics.json')); print('$name', $seed, round(m['val']['auroc'],4), round(m['val']['kl'],4))"
  done
done <<RECIPES
stats-w32-e64 logq+entropy+topk --width 32 --epochs 64
state-w8-e24 state+logq+entropy+topk --width 8 --epochs 24
state-w8-e64 state+logq+entropy+topk --width 8 --epochs 64
RECIPES
