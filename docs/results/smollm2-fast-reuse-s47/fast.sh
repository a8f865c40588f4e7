#!/bin/bash
# The forty-fifth session's fast-path bench, unchanged (../smollm2-fast-rerun-s45/fast.sh: 12 prompts x 48
# greedy tokens per set, both sets side by side, 1 thread each, the shipped greedy head), now with one
# traced decoder layer reused for all 30 (acchead.inference.compile_regions, forty-seventh session). Run on
# the Inductor cache that units.sh's two runs filled (the same units), so its warm-up is a later bench's.
#   TORCHINDUCTOR_CACHE_DIR=runs/s47/inductor bash docs/results/smollm2-fast-reuse-s47/fast.sh runs/s47/warm
exec bash "$(dirname "$0")/../smollm2-fast-rerun-s45/fast.sh" "${1:-runs/s47/fast}"
