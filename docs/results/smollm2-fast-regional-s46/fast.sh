#!/bin/bash
# The forty-fifth session's fast-path bench (../smollm2-fast-rerun-s45/fast.sh) again, the target's decoder
# layers now compiled as regions (acchead.inference.compile_regions): 12 prompts x 48 greedy tokens per set,
# both sets side by side, 1 thread each, the shipped greedy head. Run it twice with one Inductor cache
# directory: the first run's warm-up is a new machine's (cache empty), the second's every later bench's.
#   TORCHINDUCTOR_CACHE_DIR=runs/s46/inductor bash docs/results/smollm2-fast-regional-s46/fast.sh runs/s46/cold
#   TORCHINDUCTOR_CACHE_DIR=runs/s46/inductor bash docs/results/smollm2-fast-regional-s46/fast.sh runs/s46/warm
OUT=${1:-runs/s46/fast}
ARGS="--pair smollm2 --config configs/bench-smollm2.yaml --num-prompts 12 --max-new-tokens 48
  --methods autoregressive,specdec,specdecpp,hf-generate --k-grid 2,3 --h-grid 0.7,0.9
  --specdecpp-rules paper,priced --paths fast --loop-profile-prompts 0 --threads 1
  --head acchead/pair_files/smollm2-heads/greedy-lookahead/head.safetensors"
mkdir -p $OUT
acchead-bench $ARGS --prompts mtbench --out $OUT/mtbench > $OUT/mtbench.log 2>&1 &
acchead-bench $ARGS --prompts humaneval --out $OUT/humaneval > $OUT/humaneval.log 2>&1
wait
