#!/usr/bin/env bash
# Issue 10's greedy goals on more prompts: all 164 HumanEval prompts and the first 164 held-out functions,
# each set in two halves (82 prompts, one process each), 96 tokens, the shipped greedy head and the baselines
# the goals name; grids trimmed to the region where the 20-prompt benches found each method's best.
part=$1
cd /work/main
OMP_NUM_THREADS=1 .venv/bin/acchead-bench --prompts work/exp14/$part.jsonl --num-prompts 0 --max-new-tokens 96 \
  --temperature 0 --threads 1 --out work/exp14/bench-$part --head acchead/zoo/heads/greedy-lookahead \
  --k-grid 1,2,3,4,5,6,8,10 --h-grid 0.6,0.7,0.75,0.8,0.85,0.9 --tau-grid 0.1,0.2,0.3,0.4,0.5 \
  --adaedl-lam-grid 0.1,0.3 --adaedl-adapt-grid 0.1 --overhead-calls 100 \
  --methods autoregressive,specdec,specdecpp,confidence,adaedl,adaedl-adapt,oracle \
  > work/exp14/log-$part.txt 2>&1
echo DONE $part
