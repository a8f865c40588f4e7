#!/bin/bash
# The forty-fifth session's fast-path bench, unchanged (../smollm2-fast-rerun-s45/fast.sh: 12 prompts x 48
# greedy tokens per set, both sets side by side, 1 thread each, the shipped greedy head), with regional
# units loaded from the store of compiled units (acchead.inference.unit_store, forty-eighth session), whose
# SpecDec++ policies share their draft units since the forty-ninth. Run on an empty Inductor cache (and
# store): a first bench's warm-up.
#   TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) bash docs/results/smollm2-unit-share-s49/fast.sh runs/s49/cold
. .venv/bin/activate
exec bash "$(dirname "$0")/../smollm2-fast-rerun-s45/fast.sh" "${1:-runs/s49/fast}"
