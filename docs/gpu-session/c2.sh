#!/bin/bash
# call 2: the GGUF joined and converted; the response shards and eval sets in /root/data
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "editable install failed"
A=~/.cache/acchead/assets/smollm2; mkdir -p $A
cat /root/x/a .xfer/b > $A/SmolLM2-135M-Instruct.Q4_1.gguf && cp .xfer/asset.json $A/ && sha256sum $A/*.gguf
python3 -c "from pathlib import Path; from acchead.assets import convert_target; print(convert_target(Path('$A/SmolLM2-135M-Instruct.Q4_1.gguf')))" 2>&1 | tail -3
rm -rf /root/data && cp -r .xfer/data /root/data && ls /root/data && ls /root/data/responses | wc -l
ls -la ~/.cache/acchead/assets/*
timeout 60 python3 .xfer/s/states_rate.py 2>&1 | grep -v "it/s\]" | tail -5
