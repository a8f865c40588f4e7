#!/bin/bash
# warm-up unit by unit: $1 = out dir name
ARGS="--pair smollm2 --config configs/bench-smollm2.yaml --num-prompts 1 --max-new-tokens 8
  --methods autoregressive,specdec,specdecpp,hf-generate --k-grid 2,3 --h-grid 0.7,0.9
  --specdecpp-rules paper,priced --paths fast --loop-profile-prompts 0 --threads 1
  --head acchead/pair_files/smollm2-heads/greedy-lookahead/head.safetensors"
. .venv/bin/activate
/usr/bin/time -v python docs/results/smollm2-fast-regional-s46/warm_units.py $ARGS --prompts mtbench --out runs/s47/$1 > runs/s47/$1.log 2>&1
