#!/bin/bash
# acchead-train recipes on the draft's statistics alone, four splits: validation AUROC / KL.
set -e
DATA=${DATA:-runs/s42/demo-smollm2/data}
INPUTS=${INPUTS:-logq+entropy+topk}
while read -r name args; do
  for seed in 0 1 2 3; do
    out=runs/s44/recipes/${INPUTS//+/_}-$name-s$seed
    mkdir -p runs/s44/recipes
    [ -f $out/metrics.json ] || acchead-train --data $DATA --w-rej 6 --depth 3 --inputs $INPUTS --width 32 \
      --seed $seed --out $out --no-progress --threads 2 $args > $out.log 2>&1 || { cat $out.log; exit 1; }
    python -c "import json; m=json.load(open('$out/metrics.json')); print('$INPUTS $name', $seed, round(m['val']['auroc'],4), round(m['val']['kl'],4))"
  done
done <<RECIPES
${RECIPES}
RECIPES
