#!/bin/bash
# The two heads at the shipped heads' default threshold, h = 0.8 (what `acchead-decode --temperature 1` runs
# without --policy), on bench.sh's prompts and seeds: its AR and fixed-K counts are the same to the digit.
#   bash docs/results/smollm2-t1-head-s45/bench_h08.sh runs/s45/t1 HEAD1,HEAD2
RUN=${1:-runs/s45/t1}
ARGS="--pair smollm2 --config configs/bench-smollm2.yaml --num-prompts 16 --max-new-tokens 64 --temperature 1
  --methods autoregressive,specdecpp --h-grid 0.8 --loop-profile-prompts 0 --threads 1 --head $2"
mkdir -p $RUN/bench-h08
acchead-bench $ARGS --prompts mtbench --out $RUN/bench-h08/mtbench > $RUN/bench-h08/mtbench.log 2>&1 &
acchead-bench $ARGS --prompts humaneval --out $RUN/bench-h08/humaneval > $RUN/bench-h08/humaneval.log 2>&1
wait
