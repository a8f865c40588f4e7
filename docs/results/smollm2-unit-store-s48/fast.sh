#!/bin/bash
# The forty-fifth session's fast-path bench, unchanged (../smollm2-fast-rerun-s45/fast.sh: 12 prompts x 48
# greedy tokens per set, both sets side by side, 1 thread each, the shipped greedy head), now with regional
# units loaded from the store of compiled units (acchead.inference.unit_store, forty-eighth session). Run on
# the Inductor cache (and store) that units.sh's two runs filled, so its warm-up is a later bench's; then
# on an empty one.
#   TORCHINDUCTOR_CACHE_DIR=runs/s48/inductor bash docs/results/smollm2-unit-store-s48/fast.sh runs/s48/warm
. .venv/bin/activate
exec bash "$(dirname "$0")/../smollm2-fast-rerun-s45/fast.sh" "${1:-runs/s48/fast}"
