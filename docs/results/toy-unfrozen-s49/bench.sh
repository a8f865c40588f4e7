#!/bin/bash
# The toy pair's fast-path bench (4 HumanEval prompts x 32 greedy tokens; AR, K = 2 and 3, SpecDec++ with
# the shipped head at h = 0.8), alone on the box, twice on one new Inductor cache directory (the store of
# compiled units inside it): the first run compiles and stores every unit, the second loads them.
#   TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) bash bench.sh runs/s49/toy_cold; ... bash bench.sh runs/s49/toy_warm
. .venv/bin/activate
exec /usr/bin/time -v acchead-bench --pair toy --prompts humaneval --num-prompts 4 --max-new-tokens 32 \
  --methods autoregressive,specdec,specdecpp,hf-generate --k-grid 2,3 --h-grid 0.8 --temperature 0 \
  --threads 1 --paths fast --loop-profile-prompts 0 --out "$1"
