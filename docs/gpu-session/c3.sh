#!/bin/bash
# call 3: the real pair's check (bf16, fast path, backend $B), then the draft trained on $N shards from 355
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "editable install failed"
mkdir -p ~/.cache/acchead/assets/mtbench && cp .xfer/mtbench/* ~/.cache/acchead/assets/mtbench/
rm -rf acchead/pair_files && cp -r .xfer/pair_files acchead/pair_files
S=$(date +%s)
timeout ${CT:-150} python3 -m acchead.inference.bench.gpu_check --pairs smollm2 --no-tests \
  --speed-first --exact-dtypes float32 --k-grid 2,3 --h-grid 0.5,0.7 --budget-s ${CB:-90} --path fast --backend ${B:-cudagraphs} \
  --out $OUT/gpu-check-smollm2.md 2>&1 | grep -v "it/s\]" | tee $OUT/c3-check.log
echo "check took $(( $(date +%s) - S )) s"; S=$(date +%s)
R=/root/data/responses; D=/root/sub/responses; rm -rf /root/sub /root/d; mkdir -p $D
for k in $(seq 355 $((354 + ${N:-300}))); do ln -s $R/shard-$(printf %05d $k).npz $D/; done
ln -s $R/shard-00153.npz $D/shard-99998.npz; ln -s $R/shard-00154.npz $D/shard-99999.npz; ln -s $R/responses.json $D/
ls $D | wc -l
timeout ${TT:-300} acchead-distill train --device cuda --target-states --responses $D \
  --init acchead/pair_files/smollm2-draft --new-schedule --chain --soft-labels --cls-weight 0.5 \
  --lr 3e-4 --batch-size 64 --total-tokens ${TOK:-4000000} --minutes ${M:-2} --checkpoint-minutes 1 --out /root/d \
  --eval /root/data/eval-mtbench --eval /root/data/eval-humaneval 2>&1 | tr '\r' '\n' | grep -v "Loading weights\|Writing" \
  | awk 'NR%20==1 || !/tok\/s/' | tee $OUT/c3-train.log
echo "train took $(( $(date +%s) - S )) s"
ls -la /root/d /root/d/draft
[ -f /root/d/draft/model.safetensors ] && split -b 15M /root/d/draft/model.safetensors $OUT/draft.part. && cp /root/d/draft/training.json /root/d/draft/config.json $OUT/ 2>/dev/null
ls $OUT
