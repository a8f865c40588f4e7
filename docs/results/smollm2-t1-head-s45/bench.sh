#!/bin/bash
# Issue 31's T = 1 setting with the two heads that fit the repo's weight budget: 16 + 16 prompts, 64
# sampled tokens (seed i for prompt i), counts at c = 0.15, the two sets side by side, one thread each.
#   bash docs/results/smollm2-t1-head-s45/bench.sh runs/s45/t1 HEAD1,HEAD2
RUN=${1:-runs/s45/t1}
HEADS=$2
ARGS="--pair smollm2 --config configs/bench-smollm2.yaml --num-prompts 16 --max-new-tokens 64 --temperature 1
  --methods autoregressive,specdec,specdecpp --k-grid 1,2,3 --h-grid 0.3,0.5,0.7,0.9
  --loop-profile-prompts 0 --threads 1 --head $HEADS"
mkdir -p $RUN/bench
acchead-bench $ARGS --prompts mtbench --out $RUN/bench/mtbench > $RUN/bench/mtbench.log 2>&1 &
acchead-bench $ARGS --prompts humaneval --out $RUN/bench/humaneval > $RUN/bench/humaneval.log 2>&1
wait
