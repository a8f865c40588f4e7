#!/usr/bin/env bash
# Issue 21's greedy count goals on the v2 pair: all 164 HumanEval prompts and the first 164 held-out
# functions, 96 tokens, the shipped greedy lookahead head; grids trimmed to the region where the 20-prompt
# benches (final_bench.sh) found each method's best. Usage: greedy_164.sh humaneval|stdlib-heldout-functions
set -u
SET=$1
OMP_NUM_THREADS=1 .venv/bin/acchead-bench --prompts $SET --num-prompts 164 --max-new-tokens 96 --temperature 0 \
  --threads 1 --out work/v2bench/greedy164-$SET --head acchead/zoo/heads/greedy-lookahead \
  --k-grid 3,4,5 --h-grid 0.7,0.8 --tau-grid 0.1,0.3 --overhead-calls 100 \
  --methods autoregressive,specdec,specdecpp,confidence,oracle > work/v2bench/log-greedy164-$SET.txt 2>&1
echo "DONE 164 $SET"
