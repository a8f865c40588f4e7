#!/bin/bash
# The bench's warm-up unit by unit (the forty-eighth session's units.sh, unchanged but for its run
# directory): fast.sh's bench with one MT-bench prompt of 8 tokens, alone on the box; run twice on one new
# Inductor cache directory (the store of compiled units inside it), the first run's units traced and
# stored, the second's loaded.
#   TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) bash units.sh units_cold; ... bash units.sh units_warm
ARGS="--pair smollm2 --config configs/bench-smollm2.yaml --num-prompts 1 --max-new-tokens 8
  --methods autoregressive,specdec,specdecpp,hf-generate --k-grid 2,3 --h-grid 0.7,0.9
  --specdecpp-rules paper,priced --paths fast --loop-profile-prompts 0 --threads 1
  --head acchead/pair_files/smollm2-heads/greedy-lookahead/head.safetensors"
. .venv/bin/activate
mkdir -p runs/s49
/usr/bin/time -v python docs/results/smollm2-fast-regional-s46/warm_units.py $ARGS --prompts mtbench \
  --out runs/s49/$1 > runs/s49/$1.log 2>&1
