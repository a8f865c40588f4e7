#!/bin/bash
# The real pair's fast path (compiled, 1 thread) with the demo's head before (state+stats) and the
# statistics-alone head: 12 prompts x 48 greedy tokens per set, both sets side by side.
HEADS=runs/s42/demo-smollm2/head/head.safetensors,acchead/pair_files/smollm2-heads/greedy-lookahead/head.safetensors
ARGS="--pair smollm2 --config configs/bench-smollm2.yaml --num-prompts 12 --max-new-tokens 48
  --methods autoregressive,specdec,specdecpp,hf-generate --k-grid 2,3 --h-grid 0.7,0.9
  --specdecpp-rules paper,priced --paths fast --loop-profile-prompts 0 --threads 1 --head $HEADS"
acchead-bench $ARGS --prompts mtbench --out runs/s44/fast/mtbench > runs/s44/fast/mtbench.log 2>&1 &
acchead-bench $ARGS --prompts humaneval --out runs/s44/fast/humaneval > runs/s44/fast/humaneval.log 2>&1
wait
