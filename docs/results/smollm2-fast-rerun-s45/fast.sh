#!/bin/bash
# A second run of the forty-fourth session's fast-path bench (../smollm2-fast-heads-s44/fast_heads.sh) with
# the shipped greedy head alone, on a new box with Inductor's cache empty: 12 prompts x 48 greedy tokens per
# set, both sets side by side, 1 thread each.
#   bash docs/results/smollm2-fast-rerun-s45/fast.sh runs/s45/fast
OUT=${1:-runs/s45/fast}
ARGS="--pair smollm2 --config configs/bench-smollm2.yaml --num-prompts 12 --max-new-tokens 48
  --methods autoregressive,specdec,specdecpp,hf-generate --k-grid 2,3 --h-grid 0.7,0.9
  --specdecpp-rules paper,priced --paths fast --loop-profile-prompts 0 --threads 1
  --head acchead/pair_files/smollm2-heads/greedy-lookahead/head.safetensors"
mkdir -p $OUT
acchead-bench $ARGS --prompts mtbench --out $OUT/mtbench > $OUT/mtbench.log 2>&1 &
acchead-bench $ARGS --prompts humaneval --out $OUT/humaneval > $OUT/humaneval.log 2>&1
wait
