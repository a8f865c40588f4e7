#!/usr/bin/env bash
# The v2 pair's final benches (issue 21): every method on the first 20 HumanEval prompts and the first 20
# held-out stdlib functions, the same prompts, seeds and 96 tokens as v1's finals (docs/results/
# {greedy,t1k50}-{humaneval,heldout}), so that each method's move from v1 to v2 is read prompt for prompt.
# Grids trimmed to where v1's finals found each method's best. Usage: final_bench.sh greedy|t1k50 SET
set -u
S=$1; SET=$2
case $S in
  greedy) SFLAGS="--temperature 0"; EXTRA="--extra-specs mag+specdec:k=8;cascade:k=4.2/10+specdec:k=6";
          M=autoregressive,specdec,specdecpp,confidence,entropy,adaedl,adaedl-adapt,oracle,hf-assisted,extra ;;
  t1k50)  SFLAGS="--temperature 1 --top-k 50"; EXTRA="";
          M=autoregressive,specdec,specdecpp,confidence,entropy,adaedl,adaedl-adapt,hf-assisted ;;
esac
OMP_NUM_THREADS=1 .venv/bin/acchead-bench --prompts $SET --num-prompts ${NP:-20} --max-new-tokens 96 $SFLAGS \
  --threads 1 --out work/v2bench/final-$S-$SET $EXTRA \
  --head acchead/zoo/heads/$S-lookahead,acchead/zoo/heads/$S-candidate \
  --k-grid 1,2,3,4,5,6 --h-grid 0.6,0.7,0.8,0.9 --tau-grid 0.1,0.2,0.3 \
  --entropy-tau-grid 3,4 --adaedl-lam-grid 0.1,0.3 --adaedl-adapt-grid 0.1 --methods $M \
  > work/v2bench/log-final-$S-$SET.txt 2>&1
echo "FINAL DONE $S $SET"
