#!/bin/bash
# call 1: GGUF piece a kept for call 2; the toy pair on the cudagraphs backend (batched at B = 4, 16 too);
# the host-sync test
mkdir -p /root/x && cp .xfer/a /root/x/a
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
rm -rf acchead/zoo && cp -r .xfer/zoo acchead/zoo
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || { echo "editable install failed"; exit 1; }
pwd; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)"
S=$(date +%s)
timeout 260 python3 -m acchead.inference.bench.gpu_check --pairs toy --no-tests --speed-first \
  --exact-dtypes float32 --backend cudagraphs --budget-s 170 --profile autoregressive --batch-sizes 4,16 \
  --out $OUT/gpu-check-toy-cudagraphs.md 2>&1 | tee $OUT/c1-check.log
echo "check took $(( $(date +%s) - S )) s"; S=$(date +%s)
timeout 100 python3 -m pytest -q -p no:cacheprovider -o addopts= -m gpu tests/test_gpu.py -k synchronises -x 2>&1 | tail -40 | tee $OUT/c1-sync.log
echo "sync test took $(( $(date +%s) - S )) s"
