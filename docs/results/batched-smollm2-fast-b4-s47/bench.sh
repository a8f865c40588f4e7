#!/bin/bash
# The forty-second session's batched fast-path bench of the real pair at B = 4
# (../batched-smollm2-fast-b4-s42/README.md), its settings unchanged but the head: the shipped greedy head
# (that run's was its own `make demo` head), now with the target's layers compiled as regions that dynamo
# traces once (acchead.inference.compile_regions, forty-seventh session). Inductor's cache empty, as then.
#   TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) bash docs/results/batched-smollm2-fast-b4-s47/bench.sh runs/s47/b4
acchead-bench --pair smollm2 --prompts humaneval --num-prompts 16 --max-new-tokens 64 \
    --methods autoregressive,specdec,specdecpp,extra --k-grid 2 --h-grid 0.9 --specdecpp-max 6 \
    --head acchead/pair_files/smollm2-heads/greedy-lookahead/head.safetensors --threads 1 \
    --loop-profile-prompts 0 --paths fast --extra-specs "copy+specdec:k=2" --batch-size 4 \
    --batch-stop measured,gated --out "${1:-runs/s47/b4}"
