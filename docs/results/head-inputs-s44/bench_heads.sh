#!/bin/bash
# The demo's bench (8 + 8 prompts, 64 greedy tokens, counts) with the demo's head and stats-only heads.
HEADS=runs/s42/demo-smollm2/head/head.safetensors,runs/s44/recipes/logq_entropy_topk-e128-s0/head.safetensors,runs/s44/recipes/logq_entropy_topk-e64-s0/head.safetensors
ARGS="--pair smollm2 --num-prompts 8 --max-new-tokens 64 --config configs/bench-smollm2.yaml
  --methods autoregressive,specdec,specdecpp,oracle --k-grid 1,2,3,4,6 --h-grid 0.3,0.5,0.7,0.9
  --loop-profile-prompts 0 --head $HEADS"
acchead-bench $ARGS --prompts mtbench --out runs/s44/bench/mtbench > runs/s44/bench/mtbench.log 2>&1 &
acchead-bench $ARGS --prompts humaneval --out runs/s44/bench/humaneval > runs/s44/bench/humaneval.log 2>&1
wait
