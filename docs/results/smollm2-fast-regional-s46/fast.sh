#!/bin/bash
# The forty-fifth session's fast-path bench, unchanged (../smollm2-fast-rerun-s45/fast.sh: 12 prompts x 48
# greedy tokens per set, both sets side by side, 1 thread each, the shipped greedy head), now with the
# target's decoder layers compiled as regions (acchead.inference.compile_regions). Run it twice with one
# Inductor cache directory: the first run's warm-up is a new machine's (cache empty), the second's every
# later bench's.
#   TORCHINDUCTOR_CACHE_DIR=runs/s46/inductor bash docs/results/smollm2-fast-regional-s46/fast.sh runs/s46/cold
#   TORCHINDUCTOR_CACHE_DIR=runs/s46/inductor bash docs/results/smollm2-fast-regional-s46/fast.sh runs/s46/warm
exec bash "$(dirname "$0")/../smollm2-fast-rerun-s45/fast.sh" "${1:-runs/s46/fast}"
