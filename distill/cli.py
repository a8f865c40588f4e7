"""`acchead-distill`: the stages that build a draft for a target.

    acchead-distill responses --out data/smollm2/responses --num-prompts 4000   # the target's own text
    acchead-distill responses --prompts mtbench --out data/smollm2/eval-mtbench  # held-out evaluation text
    acchead-distill teacher --out data/smollm2/teacher --num-exchanges 4000     # cheap teacher-forced labels
    acchead-distill train --responses data/smollm2/responses --teacher data/smollm2/teacher \
        --out runs/smollm2-draft --minutes 60
    acchead-distill average --drafts runs/a/draft runs/b/draft --out runs/soup   # a model soup

Every stage is resumable: rerun the same command after a kill and it continues where it stopped.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from acchead.errors import USER_PATH_ERRORS, AccheadError, thread_count

PROG = "acchead-distill"


def _add_target(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--pair",
        choices=("smollm2",),
        default="smollm2",
        help="the pair whose target answers (its assets: `acchead-assets`)",
    )
    p.add_argument(
        "--target",
        default=None,
        help="the target instead of the pair's: a transformers directory or a .gguf file",
    )
    p.add_argument("--threads", type=thread_count, default=None,
                   help="torch CPU threads (default or 0: torch's choice)")
    p.add_argument(
        "--device",
        default="cpu",
        help="where the models run: cpu (default) or cuda[:N]; the target stays float32 (but under "
        "`responses --dtype bfloat16`), so a GPU's greedy responses and labels are the float32 target's "
        "(its training steps use bfloat16 autocast on a GPU, a feature draft's also on a CPU with AMX or "
        "AVX-512 BF16)",
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Build a draft for a target by distillation.")
    sub = p.add_subparsers(dest="stage", required=True)
    r = sub.add_parser(
        "responses",
        help="the target's greedy responses to ShareGPT chat prompts and Python function headers",
        description="Generate the target's greedy responses (the draft's training text), shard by shard; "
        "a rerun with the same arguments resumes after the last complete shard, and a larger "
        "--num-prompts extends a finished run.",
    )
    _add_target(r)
    r.add_argument("--out", type=Path, required=True, help="directory of the response shards")
    r.add_argument("--prompts", choices=("train", "mtbench", "humaneval"), default="train",
                   help="train: ShareGPT openings and Python function headers (the plan below); mtbench: "
                   "MT-bench's 80 first turns (chat); humaneval: HumanEval's 164 prompts (raw)")  # fmt: skip
    r.add_argument("--num-prompts", type=int, default=4000, help="prompts in the plan (default 4000)")
    r.add_argument(
        "--code-every",
        type=int,
        default=4,
        help="every N-th prompt is a Python function header, the rest ShareGPT chat (0: none)",
    )
    r.add_argument("--max-new-tokens", type=int, default=192, help="response budget per prompt (192)")
    r.add_argument(
        "--max-prompt-tokens",
        type=int,
        default=384,
        help="prompts longer than this (after the chat template) are skipped (384)",
    )
    r.add_argument("--batch-size", type=int, default=16, help="prompts per generate call (16)")
    r.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="the target's weights while answering (float32); bfloat16 is ~1.8x faster on a CPU "
                   "with AMX, and its greedy text leaves float32's within 32 tokens in about half of the "
                   "answers; each shard records it")  # fmt: skip
    r.add_argument("--shard-prompts", type=int, default=64, help="plan items per shard file (64)")
    r.add_argument("--group-shards", type=int, default=1,
                   help="shards answered together (1; at least as many as one batch spans): their prompts "
                   "are sorted by length before being cut into batches, so each batch pads less; a kill "
                   "loses the group in flight")  # fmt: skip
    r.add_argument("--minutes", type=float, default=None,
                   help="stop starting new shards after this long (default: answer the whole plan); "
                   "what is answered is saved, and a rerun goes on")  # fmt: skip
    f = sub.add_parser(
        "teacher",
        help="the target's argmax over ShareGPT's opening exchanges, teacher-forced (cheap extra labels)",
        description="Label ShareGPT's opening exchanges (the human turn through the chat template, then "
        "GPT's reply) with the target's argmax at every reply position, one forward per batch; shard by "
        "shard, resumable like `responses`. The held-out openings never enter.",
    )  # fmt: skip
    _add_target(f)
    f.add_argument("--out", type=Path, required=True, help="directory of the label shards")
    f.add_argument("--num-exchanges", type=int, default=4000, help="exchanges to label (4000)")
    f.add_argument("--max-len", type=int, default=512, help="tokens per exchange, prompt included (512)")
    f.add_argument("--batch-size", type=int, default=8, help="exchanges per forward (8)")
    f.add_argument("--shard-exchanges", type=int, default=128, help="exchanges per shard file (128)")
    fe = sub.add_parser(
        "features",
        help="the target's final hidden states over its responses (a feature draft's training input)",
        description="Run the target teacher-forced over each prompt + response of a responses directory "
        "(or each exchange of a teacher directory) and store its final hidden states (float16), one "
        "features file per shard; resumable.",
    )  # fmt: skip
    _add_target(fe)
    text = fe.add_mutually_exclusive_group(required=True)
    text.add_argument("--responses", type=Path, help="a directory of response shards (`responses`)")
    text.add_argument("--teacher", type=Path,
                      help="a directory of teacher shards (`teacher`): ShareGPT's exchanges")  # fmt: skip
    fe.add_argument("--out", type=Path, required=True, help="directory of the features files")
    fe.add_argument("--batch-tokens", type=int, default=3072, help="tokens per forward, padding included")
    fe.add_argument(
        "--dtype",
        choices=("auto", "float32", "bfloat16"),
        default="auto",
        help="the target's forward: float32, or bfloat16 autocast (2x faster with AMX, emulated and ~7x "
        "slower on an AVX2-only CPU); auto (default): bfloat16 on a GPU or a CPU with AMX or AVX-512 BF16",
    )
    fe.add_argument("--minutes", type=float, default=None, help="stop starting shards after this long")
    fe.add_argument("--fused-layers", default="", metavar="I,J,...",
                    help="also store these decoder layers' outputs after the final state (EAGLE-3's fused "
                    "states, for a draft trained with `train --fused-layers`; each below the last layer; "
                    "default: none)")  # fmt: skip
    c = sub.add_parser(
        "cost",
        help="the draft's cost per token against the target's: multiply-adds and measured step time",
        description="Print the draft/target ratio c of multiply-adds per token and of measured one-token "
        "KV-cached step time (target and draft interleaved round by round, median of the rounds' ratios).",
    )  # fmt: skip
    _add_target(c)
    c.add_argument("--draft", default=None, help="the draft directory (default: the pair's shipped draft)")
    c.add_argument("--context", type=int, default=128, help="tokens in the KV cache when timing (128)")
    c.add_argument("--calls", type=int, default=30, help="timed steps per model per round (30)")
    c.add_argument("--rounds", type=int, default=5, help="interleaved rounds (5)")
    c.add_argument("--goal", type=float, default=0.15, help="the ratio each c is compared with (0.15)")
    t = sub.add_parser(
        "train",
        help="train the reduced-vocabulary draft on response shards (resumable)",
        description="Train the draft on the target's responses for --minutes, continuing from OUT's "
        "checkpoint when there is one, else from --init (a draft directory, e.g. the shipped one), else "
        "from the target (its embedding rows of the vocabulary and the layers --layers).",
    )  # fmt: skip
    _add_target(t)
    t.add_argument("--responses", type=Path, required=True, help="a directory of response shards")
    t.add_argument("--teacher", type=Path, action="append", default=[],
                   help="a directory of `teacher` label shards, trained on beside the responses "
                   "(repeatable; a feature draft reads their states from --features too)")  # fmt: skip
    t.add_argument("--out", type=Path, required=True, help="run directory (checkpoint.pt, draft/)")
    t.add_argument("--init", type=Path, default=None,
                   help="a draft directory to start from (no checkpoint); its training.json's token count "
                        "continues the learning-rate schedule unless --new-schedule")
    t.add_argument("--new-schedule", action="store_true",
                   help="with --init: start the schedule (warm-up, cosine over --total-tokens) and the token "
                        "count anew from its weights")
    t.add_argument("--vocab-size", type=int, default=8192, help="V_d, the draft's vocabulary (8192)")
    t.add_argument("--vocab-background", type=int, default=3000,
                   help="rank tokens the responses have not shown by their counts in the assistant turns of "
                   "the first N ShareGPT conversations (0: none) and in the --teacher labels (only when the "
                   "draft is created)")  # fmt: skip
    t.add_argument(
        "--layers",
        default=None,
        help="the target's layers the draft starts from (default 0,29; a feature draft: the last)",
    )
    t.add_argument("--grow-layers", type=int, default=0, metavar="N",
                   help="with --init: add N decoder layers on top of its draft, copies of its last whose "
                   "output projections start at zero, so the grown draft starts as the same function "
                   "(ignored when resuming: the checkpoint has them; default 0)")  # fmt: skip
    t.add_argument("--grow-vocab", type=int, default=0, metavar="N",
                   help="with --init: add head rows for the N tokens the training responses hold most often "
                   "that its head lacks, each starting as the least-squares map of the token's embedding row "
                   "into the head's space (V_d grows by N, the draft's cost by N x H multiply-adds a token; "
                   "ignored when resuming; default 0)")  # fmt: skip
    t.add_argument("--fused-layers", default=None, metavar="I,J,...",
                   help="a feature draft also reads these target layers' outputs beside its final state "
                   "(EAGLE-3's fused states; --features must hold them: `features --fused-layers`). With "
                   "--init, the new input columns start at zero, so the draft starts as the same function "
                   "(default: the --init or resumed draft's, else none)")  # fmt: skip
    t.add_argument("--soft-labels", action="store_true",
                   help="a feature draft learns the target's distribution over its vocabulary at every "
                   "position, prompt included (default: the greedy token on response positions)")  # fmt: skip
    t.add_argument("--chain", type=int, nargs="?", const=2, default=1, metavar="N",
                   help="a feature draft also learns as the candidates 2..N of a round, which read its own "
                   "guesses of the states as decoding does (N forwards per step; --chain alone: N = 2; "
                   "default 1: first candidates only)")  # fmt: skip
    t.add_argument("--cls-weight", type=float, default=None,
                   help="a feature draft's token loss weight, beside the state regression (0.1)")  # fmt: skip
    t.add_argument(
        "--features",
        type=Path,
        default=None,
        help="train a feature (EAGLE) draft: a directory holding, per responses or teacher directory "
        "(by name: --responses, each --teacher and --eval), the target's states from `features`",
    )
    t.add_argument("--target-states", action="store_true",
                   help="train a feature draft on the target's states computed in memory on "
                   "--device when the stage starts, instead of --features' files (no features stage; "
                   "for a GPU)")  # fmt: skip
    t.add_argument("--minutes", type=float, default=60.0, help="training time of this run (60)")
    t.add_argument("--held-out-shards", type=int, default=2,
                   help="the last N shards are not trained on; agreement is measured there (2)")  # fmt: skip
    t.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (1e-3)")
    t.add_argument("--batch-size", type=int, default=8, help="responses per step (8)")
    t.add_argument("--max-len", type=int, default=512, help="tokens per example, prompt included (512)")
    t.add_argument("--total-tokens", type=int, default=20_000_000,
                   help="labelled tokens the cosine schedule spans, across resumed runs (20M)")  # fmt: skip
    t.add_argument("--checkpoint-minutes", type=float, default=10.0, help="minutes between checkpoints (10)")
    t.add_argument("--eval", type=Path, action="append", default=[],
                   help="a responses directory to report top-1 agreement on (repeatable; e.g. the target's "
                   "MT-bench and HumanEval responses from `responses --prompts`)")  # fmt: skip
    a = sub.add_parser(
        "average",
        help="a weighted average of drafts' weights (a model soup), then its agreement on --eval sets",
        description="Average the weights of drafts of one architecture and vocabulary (e.g. runs that "
        "went on one from another) into a new draft directory, exported in bf16 as `train` exports; "
        "with --eval, report its agreement as `train` does. The last draft's training.json goes on "
        "(a later `train --init` continues its schedule) with what was averaged.",
    )  # fmt: skip
    _add_target(a)
    a.add_argument("--drafts", type=Path, nargs="+", required=True, help="the draft directories to average")
    a.add_argument("--weights", type=float, nargs="+", default=None,
                   help="one weight per draft, normalised to sum 1 (default: uniform)")  # fmt: skip
    a.add_argument("--out", type=Path, required=True, help="the averaged draft's directory")
    a.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    a.add_argument("--eval", type=Path, action="append", default=[],
                   help="a responses directory to report top-1 agreement on (repeatable)")  # fmt: skip
    a.add_argument("--features", type=Path, default=None,
                   help="a feature draft's --eval states: a directory holding the target's states per "
                   "--eval directory (by name), from `features`")  # fmt: skip
    a.add_argument("--target-states", action="store_true",
                   help="a feature draft's --eval states computed by the target when the stage starts")
    a.add_argument("--max-len", type=int, default=512, help="tokens per example, prompt included (512)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.threads:  # None or 0: torch's default
            import torch

            torch.set_num_threads(args.threads)
        from acchead.models import check_device

        check_device(args.device)  # a bad --device fails here, before prompts and models are loaded
        from acchead.distill.stages import (
            run_cost_stage,
            run_features_stage,
            run_responses_stage,
            run_teacher_stage,
        )
        from acchead.distill.train_stage import run_average_stage, run_train_stage

        stages = {"responses": run_responses_stage, "teacher": run_teacher_stage, "cost": run_cost_stage,
                  "features": run_features_stage,
                  "train": run_train_stage, "average": run_average_stage}  # fmt: skip
        summary = stages[args.stage](args)
    except (AccheadError, *USER_PATH_ERRORS) as e:  # one line, like cli_errors
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    print(" ".join(f"{k}={v}" for k, v in summary.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
