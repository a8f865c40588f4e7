#!/bin/bash
# Issue 31's T = 1 goal with today's draft: heads on T = 1 labels with and without the draft's state,
# 16 + 16 prompts, 64 sampled tokens, counts (seed i for prompt i), both sets side by side.
HEADS=runs/s44/t1/sweep/state-e24-s0/head.safetensors,runs/s44/t1/sweep/stats-e64-s0/head.safetensors
ARGS="--pair smollm2 --config configs/bench-smollm2.yaml --num-prompts 16 --max-new-tokens 64 --temperature 1
  --methods autoregressive,specdec,specdecpp --k-grid 1,2,3 --h-grid 0.3,0.5,0.7,0.9
  --loop-profile-prompts 0 --threads 1 --head $HEADS"
acchead-bench $ARGS --prompts mtbench --out runs/s44/t1/bench/mtbench > runs/s44/t1/bench/mtbench.log 2>&1 &
acchead-bench $ARGS --prompts humaneval --out runs/s44/t1/bench/humaneval > runs/s44/t1/bench/humaneval.log 2>&1
wait
