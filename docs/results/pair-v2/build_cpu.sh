#!/usr/bin/env bash
# The v2 pair and its shipped heads as built on the 2-core CPU box on 2026-11-24 (no GPU was lent to the
# session): the H100 recipe of `acchead/zoo/pairs.py` with a CPU clock and batch. Run from the repository
# root; every stage resumes when rerun. work/v1/ holds a copy of the v1 pair (acchead/zoo/ before issue 21).
set -eu
B=.venv/bin; W=work/zoo-v2; O=$W/out; H=work/v2heads
Z="--pair v2 --device cpu --threads 2 --work-dir $W --out-dir $O --batch-size 16 --budget-scale 0.05"

stage=${1:-all}  # all = target, draft (+ report), heads; then install
if [ "$stage" = all ] || [ "$stage" = target ]; then
  $B/acchead-build-zoo $Z --stage target --minutes 65
fi
if [ "$stage" = all ] || [ "$stage" = draft ]; then
  # Distilled from v1's shipped draft (same shape and tokenizer), not from a fresh corpus draft: on a CPU
  # clock the start is worth more than the recipe's 5-minute corpus draft.
  $B/acchead-build-zoo $Z --stage draft --distill-init work/v1/pycode-draft --teacher-windows 4000 --minutes 22
  $B/acchead-build-zoo $Z --stage report --baseline-draft work/v1/pycode-draft
fi
if [ "$stage" = all ] || [ "$stage" = heads ]; then
  G="--target $O/pycode-target --draft $O/pycode-draft --prompt-set stdlib-functions --max-new-tokens 96"
  G="$G --cache-features on"
  gen() {  # name, prompts, r, sampling flags
    OMP_NUM_THREADS=2 $B/acchead-gen-data $G --num-prompts $2 --mix-ratio $3 $4 --out $H/data-$1
  }
  train() {  # data, out, kind flags
    [ -f $H/$2/head.safetensors ] && return
    $B/acchead-train --data $H/data-$1 --out $H/$2 $3 --depth 3 --threads 2 --no-progress --logger none
  }
  LA="--kind lookahead --inputs state+token --w-rej 3 --epochs 8"
  CA="--kind candidate --inputs state --w-rej 6 --epochs 4"
  gen greedy-r1 ${NG:-1500} 1.0 "--temperature 0"
  train greedy-r1 greedy-lookahead "$LA"
  gen t1k50-r1 ${NT:-1500} 1.0 "--temperature 1 --top-k 50"
  train t1k50-r1 t1k50-lookahead "$LA"
  gen greedy-r015 ${NC:-700} 0.15 "--temperature 0"
  train greedy-r015 greedy-candidate "$CA"
  gen t1k50-r015 ${NC:-700} 0.15 "--temperature 1 --top-k 50"
  train t1k50-r015 t1k50-candidate "$CA"
fi
if [ "$stage" = install ]; then  # ship it: replace the pair and the four heads in acchead/zoo/
  for m in pycode-target pycode-draft; do rm -rf acchead/zoo/$m; cp -r $O/$m acchead/zoo/$m; done
  for h in greedy-lookahead t1k50-lookahead greedy-candidate t1k50-candidate; do
    mkdir -p acchead/zoo/heads/$h; cp $H/$h/head.safetensors $H/$h/metrics.json acchead/zoo/heads/$h/
  done
  cp $O/pair_report.json docs/results/pair-v2/pair_report.json
fi
echo "BUILD DONE $stage"
