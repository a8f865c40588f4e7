#!/usr/bin/env bash
# The head-kind study and the final benches of the README, as they were run (from the repository root).
# Stages: gen-data (S x r), heads, dev bench, final benches. Each stage resumes when rerun.
set -u

# ---- work/exp/gen.sh
# gen-data for (S, r), two processes at a time, one thread each
B=.venv/bin
T=runs/zoo/pycode-target; D=runs/zoo/pycode-draft
run() {  # S-name, sampling flags, r
  OMP_NUM_THREADS=1 $B/acchead-gen-data --target $T --draft $D --prompt-set stdlib-functions --num-prompts ${NP:-1500} \
    --max-new-tokens 96 $2 --mix-ratio $3 --cache-features on --out work/exp/data/$1-r$3 > work/exp/log-gen-$1-r$3.txt 2>&1
}
run greedy "--temperature 0" 1.0 & run t1k50 "--temperature 1 --top-k 50" 1.0 & wait
run greedy "--temperature 0" 0.15 & run t1k50 "--temperature 1 --top-k 50" 0.15 & wait
run greedy "--temperature 0" 0.5 & run t1k50 "--temperature 1 --top-k 50" 0.5 & wait
echo GEN DONE

# ---- work/exp/train.sh
# heads for every (S, r): the paper's candidate head and lookahead heads with each input set
B=.venv/bin
one() {  # data-dir out kind inputs w_rej
  [ -f $2/head.safetensors ] && return
  $B/acchead-train --data $1 --out $2 --kind $3 --inputs $4 --w-rej $5 --depth 3 --epochs ${EPOCHS:-4} \
     --threads 1 --no-progress --logger none > $2.log 2>&1 || echo "FAILED $2"
}
for S in ${SS:-greedy t1k50}; do
  for r in ${RS:-1.0 0.15 0.5}; do
    d=work/exp/data/$S-r$r; [ -f $d/gen_config.json ] || continue
    h=work/exp/heads/$S/r$r; mkdir -p work/exp/heads/$S
    [ $r != 1.0 ] && one $d $h-candidate candidate state 6 &
    one $d $h-la-state lookahead state 3 &
    wait
    one $d $h-la-stats lookahead state+logq+entropy 3 &
    one $d $h-la-token lookahead state+token 3 &
    wait
    one $d $h-la-all lookahead state+logq+entropy+token 3
  done
done
echo TRAIN DONE

# ---- work/exp/dev_bench.sh
# dev-set bench (16 stdlib-functions prompts the heads never saw, never HumanEval or held-out files):
# every trained head of one S, the h grid, fixed K for reference
S=$1; SFLAGS=$2
heads=$(ls -d work/exp/heads/$S/*/head.safetensors | paste -sd, -)
OMP_NUM_THREADS=1 .venv/bin/acchead-bench --prompts work/exp/dev.jsonl --num-prompts ${NP:-16} --max-new-tokens 64 $SFLAGS \
  --target runs/zoo/pycode-target --draft runs/zoo/pycode-draft --head "$heads" \
  --methods autoregressive,specdec,specdecpp,confidence --k-grid 1,2,3,4,6 --h-grid 0.2,0.35,0.5,0.65,0.8 \
  --tau-grid 0.1,0.3,0.5,0.7,0.9 --threads 1 --out work/exp/dev-$S > work/exp/log-dev-$S.txt 2>&1
echo DEV DONE $S

# ---- work/exp/final_bench.sh
# The final benches: every method on HumanEval and on held-out stdlib functions, for one S
S=$1; SFLAGS=$2; SET=$3; EXTRA=${4:-}
OMP_NUM_THREADS=1 .venv/bin/acchead-bench --prompts $SET --num-prompts ${NP:-20} --max-new-tokens 96 $SFLAGS \
  --threads 1 --out work/exp/final-$S-$SET ${EXTRA:+--extra-specs "$EXTRA"} \
  --methods autoregressive,specdec,specdecpp,confidence,entropy,adaedl,adaedl-adapt,oracle,hf-assisted,extra \
  > work/exp/log-final-$S-$SET.txt 2>&1
echo FINAL DONE $S $SET

# dev prompts: python -c "import json; from acchead.zoo.prompts import load_prompt_set; [print(json.dumps({\"prompt\": p})) for p in load_prompt_set(\"stdlib-functions\")[5000:5016]]" > work/exp/dev.jsonl

# ---- second round (2026-11-23): more data, more epochs, the final benches of the README
# gen-data on 5,000 stdlib-functions prompts (0-4999; the dev prompts 5000-5015 stay unseen), r = 1, both S
for S in "greedy:--temperature 0" "t1k50:--temperature 1 --top-k 50"; do
  OMP_NUM_THREADS=2 $B/acchead-gen-data --target $T --draft $D --prompt-set stdlib-functions --num-prompts 5000 \
    --max-new-tokens 96 ${S#*:} --mix-ratio 1.0 --cache-features on --out work/exp12/data-${S%%:*}-r1-5k
done
# lookahead heads, depth 3, w_rej 3, 8 epochs, one per input set (greedy); state+token and all inputs (T = 1)
for v in state:state token:state+token logqtok:state+logq+token all:state+logq+entropy+token \
         alltop:state+logq+entropy+token+topk; do
  $B/acchead-train --data work/exp12/data-greedy-r1-5k --out work/exp12/heads/${v%%:*}-e8 --kind lookahead \
    --inputs ${v#*:} --w-rej 3 --depth 3 --epochs 8 --threads 1 --no-progress --logger none
done
# variants: alltop with 16 epochs (alltop-e16-w3), w_rej 2 and 5 (alltop-e8-w2/-w5), state+token at depth 2
# (token-e8-d2); T = 1 heads on data-t1k50-r1-5k into work/exp12/t1heads/{token,all,alltop}-e8, same flags
# shipped: greedy-lookahead = heads/token-e8, t1k50-lookahead = t1heads/token-e8 (same flags on the T = 1 data);
# final benches: every method, the shipped heads of S and the previous lookahead head side by side
E="mag+specdec:k=8;cascade:k=4.2/10+specdec:k=6"
final() {  # S-name, sampling flags, prompt set, heads, extra specs
  OMP_NUM_THREADS=1 $B/acchead-bench --prompts $3 --num-prompts 20 --max-new-tokens 96 $2 --threads 1 \
    --out work/exp12/final-$1-$3 --head "$4" ${5:+--extra-specs "$5"} --h-grid 0.3,0.5,0.6,0.7,0.75,0.8,0.85,0.9,0.95 \
    --methods autoregressive,specdec,specdecpp,confidence,entropy,adaedl,adaedl-adapt,oracle,hf-assisted,extra
}
Z=acchead/zoo/heads; O=work/exp12/old-heads  # old-heads: the lookahead heads shipped before this round
final greedy "--temperature 0" humaneval $Z/greedy-lookahead,$Z/greedy-candidate,$O/greedy-lookahead-1k5 "$E" &
final greedy "--temperature 0" stdlib-heldout-functions $Z/greedy-lookahead,$Z/greedy-candidate,$O/greedy-lookahead-1k5 &
wait
final t1k50 "--temperature 1 --top-k 50" humaneval $Z/t1k50-lookahead,$Z/t1k50-candidate,$O/t1k50-lookahead-r015 &
final t1k50 "--temperature 1 --top-k 50" stdlib-heldout-functions $Z/t1k50-lookahead,$Z/t1k50-candidate,$O/t1k50-lookahead-r015 &
wait

# ---- third round (2026-11-23, next session): twice the greedy prompts, with the new stdlib-function-bodies set
# prompts: stdlib-functions 0-4999 and 5056-6059 (the dev40 prompts 5016-5055 stay unseen as headers) plus the
# first 4,000 stdlib-function-bodies prompts (functions cut after a random body statement): 10,004 prompts
python -c "import json; from acchead.zoo.prompts import load_prompt_set as L; f = L('stdlib-functions'); \
b = L('stdlib-function-bodies'); [print(json.dumps({'prompt': p})) for p in f[:5000] + f[5056:] + b[:4000]]" \
  > work/exp13/train10k.jsonl
OMP_NUM_THREADS=2 $B/acchead-gen-data --target $T --draft $D --prompts work/exp13/train10k.jsonl --max-new-tokens 96 \
  --temperature 0 --mix-ratio 1.0 --cache-features on --out work/exp13/data-greedy-r1-10k
for v in token:state+token logqtok:state+logq+token; do
  $B/acchead-train --data work/exp13/data-greedy-r1-10k --out work/exp13/heads/${v%%:*}-e8 --kind lookahead \
    --inputs ${v#*:} --w-rej 3 --depth 3 --epochs 8 --threads 1 --no-progress --logger none
done
# dev bench: 40 stdlib-functions prompts (5016-5055) no header training saw; the shipped 5k head vs the 10k heads
# (work/exp12/dev40.jsonl: load_prompt_set("stdlib-functions")[5016:5056] as {"prompt": ...} lines)
OMP_NUM_THREADS=1 $B/acchead-bench --prompts work/exp12/dev40.jsonl --num-prompts 40 --max-new-tokens 96 \
  --temperature 0 --target $T --draft $D --threads 1 --out work/exp13/dev40 \
  --head acchead/zoo/heads/greedy-lookahead,work/exp13/heads/token-e8,work/exp13/heads/logqtok-e8,work/exp12/heads/logqtok-e8 \
  --methods autoregressive,specdec,specdecpp,oracle --k-grid 2,3,4 --h-grid 0.6,0.7,0.75,0.8,0.85,0.9
# shipped: greedy-lookahead = work/exp13/heads/token-e8; final greedy benches as in the second round, with the
# previous (5k) lookahead head beside it
O=work/exp13/old-heads  # greedy-lookahead-5k: the head shipped by the second round
final() {  # prompt set, extra specs
  OMP_NUM_THREADS=1 $B/acchead-bench --prompts $1 --num-prompts 20 --max-new-tokens 96 --temperature 0 --threads 1 \
    --out work/exp13/final-greedy-$1 --head "$Z/greedy-lookahead,$Z/greedy-candidate,$O/greedy-lookahead-5k" \
    ${2:+--extra-specs "$2"} --h-grid 0.3,0.5,0.6,0.7,0.75,0.8,0.85,0.9,0.95 \
    --methods autoregressive,specdec,specdecpp,confidence,entropy,adaedl,adaedl-adapt,oracle,hf-assisted,extra
}
final humaneval "$E" &
final stdlib-heldout-functions &
wait
# the same goals on 8x more prompts: all 164 HumanEval prompts and the first 164 held-out functions, each in two
# halves of 82 (work/exp14/{he,ho}-{a,b}.jsonl from load_prompt_set(...)[:164]), four processes on the 2 cores
for p in he-a he-b ho-a ho-b; do docs/results/greedy-164/big_bench.sh $p & done; wait
python docs/results/greedy-164/combine.py he; python docs/results/greedy-164/combine.py ho
