"""`acchead-distill`: the stages that build a draft for a target.

    acchead-distill responses --out data/smollm2/responses --num-prompts 4000   # the target's own text
    acchead-distill responses --prompts mtbench --out data/smollm2/eval-mtbench  # held-out evaluation text
    acchead-distill teacher --out data/smollm2/teacher --num-exchanges 4000     # cheap teacher-forced labels
    acchead-distill train --responses data/smollm2/responses --teacher data/smollm2/teacher \
        --out runs/smollm2-draft --minutes 60

Every stage is resumable: rerun the same command after a kill and it continues where it stopped.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import asdict
from functools import partial
from pathlib import Path

from acchead.errors import AccheadError

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
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument(
        "--device",
        default="cpu",
        help="where the models run: cpu (default) or cuda[:N]; the target stays float32 everywhere, so "
        "a GPU's greedy responses and labels are the float32 target's (its training steps use bfloat16 "
        "autocast on a GPU)",
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
    r.add_argument("--shard-prompts", type=int, default=64, help="plan items per shard file (64)")
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
        "and store its final hidden states (float16), one features file per shard; resumable.",
    )  # fmt: skip
    _add_target(fe)
    fe.add_argument("--responses", type=Path, required=True, help="a directory of response shards")
    fe.add_argument("--out", type=Path, required=True, help="directory of the features files")
    fe.add_argument("--batch-tokens", type=int, default=3072, help="tokens per forward, padding included")
    fe.add_argument(
        "--float32",
        action="store_true",
        help="run the target in float32 (default: bfloat16 autocast, 2x faster with AMX)",
    )
    fe.add_argument("--minutes", type=float, default=None, help="stop starting shards after this long")
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
                   "(repeatable)")  # fmt: skip
    t.add_argument("--out", type=Path, required=True, help="run directory (checkpoint.pt, draft/)")
    t.add_argument("--init", type=Path, default=None, help="a draft directory to start from (no checkpoint)")
    t.add_argument("--vocab-size", type=int, default=8192, help="V_d, the draft's vocabulary (8192)")
    t.add_argument("--vocab-background", type=int, default=3000,
                   help="rank tokens the responses have not shown by their counts in the assistant turns of "
                   "the first N ShareGPT conversations (0: none) and in the --teacher labels (only when the "
                   "draft is created)")  # fmt: skip
    t.add_argument(
        "--layers",
        default=None,
        help="the target's layers the draft starts from (default 0,29; a feature draft: 29)",
    )
    t.add_argument(
        "--features",
        type=Path,
        default=None,
        help="train a feature (EAGLE) draft: a directory holding, per responses directory (by "
        "name, --responses and each --eval), the target's states from `features`",
    )
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
    return p


def _check_positive(args: argparse.Namespace, names: tuple[str, ...]) -> None:
    for name in names:
        if getattr(args, name) < 1:
            raise AccheadError(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(args, name)})")


def run_responses_stage(args: argparse.Namespace) -> dict:
    _check_positive(
        args, ("num_prompts", "max_new_tokens", "max_prompt_tokens", "batch_size", "shard_prompts")
    )
    if args.code_every < 0:
        raise AccheadError("--code-every must be >= 0")
    if args.minutes is not None and args.minutes <= 0:
        raise AccheadError("--minutes must be > 0")
    from acchead.assets import TARGET_DIR_NAME, asset_path
    from acchead.chat_sets import (
        SHAREGPT_HELDOUT,
        chat_prompt_set,
        mtbench_prompts,
        sharegpt_later_turns,
    )
    from acchead.distill.responses import PlanItem, ResponsesConfig, build_plan, run_responses
    from acchead.models import load_causal_lm, load_tokenizer, model_identity
    from acchead.prompt_sets import load_prompt_set

    target_path = args.target or asset_path(TARGET_DIR_NAME)
    if args.prompts == "mtbench":
        plan = [PlanItem(p, True, "mtbench") for p in mtbench_prompts()]
    elif args.prompts == "humaneval":
        plan = [PlanItem(p, False, "humaneval") for p in load_prompt_set("humaneval")]
    else:
        chat = chat_prompt_set("sharegpt")  # the "sharegpt-heldout" openings never enter a plan
        # Python function headers with docstrings (the form HumanEval prompts take), from the stdlib
        code = load_prompt_set("stdlib-functions") if args.code_every else []
        # past the openings, ShareGPT's later human turns (never a held-out conversation's)
        more = sharegpt_later_turns() if args.num_prompts > len(chat) + len(code) else []
        plan = build_plan(chat, code, args.num_prompts, args.code_every, more)
    target, tok = load_causal_lm(target_path), load_tokenizer(target_path)
    fingerprint = model_identity(target)["fingerprint"]  # of the weights as stored, before any move
    target = _to_device(target, args.device)
    config = ResponsesConfig(
        target=fingerprint, prompts=args.prompts, num_prompts=len(plan),
        code_every=args.code_every,
        max_new_tokens=args.max_new_tokens, max_prompt_tokens=args.max_prompt_tokens,
        shard_prompts=args.shard_prompts, heldout_chat=SHAREGPT_HELDOUT,
    )  # fmt: skip
    seconds = None if args.minutes is None else args.minutes * 60
    summary = run_responses(target, tok, plan, args.out, config, args.batch_size, max_seconds=seconds)
    return {**asdict(config), **summary}


def run_teacher_stage(args: argparse.Namespace) -> dict:
    _check_positive(args, ("num_exchanges", "max_len", "batch_size", "shard_exchanges"))
    from acchead.assets import TARGET_DIR_NAME, asset_path
    from acchead.chat_sets import sharegpt_exchanges
    from acchead.distill.teacher import TeacherConfig, exchange_ids, run_teacher
    from acchead.models import load_causal_lm, load_tokenizer, model_identity
    from acchead.prompting import encode_prompt

    target_path = args.target or asset_path(TARGET_DIR_NAME)
    target, tok = load_causal_lm(target_path), load_tokenizer(target_path)
    exchanges = []
    for prompt, reply in sharegpt_exchanges(args.num_exchanges):
        p = encode_prompt(tok, prompt, chat=True)
        if len(p) < args.max_len:  # room for at least one reply token
            exchanges.append((exchange_ids(tok, p, reply, args.max_len), len(p)))
    config = TeacherConfig(target=model_identity(target)["fingerprint"], num_exchanges=len(exchanges),
                           max_len=args.max_len, shard_exchanges=args.shard_exchanges)  # fmt: skip
    target = _to_device(target, args.device)
    return {**asdict(config), **run_teacher(target, tok, exchanges, args.out, config, args.batch_size)}


def run_features_stage(args: argparse.Namespace) -> dict:
    _check_positive(args, ("batch_tokens",))
    from acchead.assets import TARGET_DIR_NAME, asset_path
    from acchead.distill.features import run_features
    from acchead.models import load_causal_lm

    target = _to_device(load_causal_lm(args.target or asset_path(TARGET_DIR_NAME)), args.device)
    seconds = None if args.minutes is None else args.minutes * 60
    return run_features(target, args.responses, args.out, args.batch_tokens, not args.float32, seconds)


def _to_device(model, device: str):
    """`model` on `device`, or a one-line error naming what is missing."""
    from acchead.models import check_device

    check_device(device)
    return model.to(device)


def run_cost_stage(args: argparse.Namespace) -> dict:
    _check_positive(args, ("context", "calls", "rounds"))
    from acchead.models import load_causal_lm
    from acchead.pairs import resolve_pair
    from acchead.step_cost import measure_cost

    pair = resolve_pair(args.pair, args.target, args.draft)
    report = measure_cost(load_causal_lm(pair.target), load_causal_lm(pair.draft), args.context, args.calls,
                          args.rounds)  # fmt: skip
    for line in report.lines(args.goal):
        print(line)
    return asdict(report)


def _assistant_token_counts(tokenizer, conversations: int) -> Counter:
    """Token counts of the assistant turns of the first `conversations` ShareGPT records."""
    from acchead.chat_sets import iter_sharegpt

    texts = []
    for i, record in enumerate(iter_sharegpt()):
        if i >= conversations:
            break
        texts += [t["value"] for t in record.get("conversations") or () if t.get("from") == "gpt"]
    counts: Counter = Counter()
    for ids in tokenizer(texts, add_special_tokens=False).input_ids:
        counts.update(ids)
    return counts


def _pack_with_states(root: Path, pack, directory: Path, paths: list[Path], shards: list, *args) -> list:
    """A feature draft's examples of `shards` (read from `paths` of `directory`), with the target's states
    from `root / directory.name` (`acchead-distill features`)."""
    from acchead.distill.features import load_features

    return pack(shards, [load_features(root / Path(directory).name, p) for p in paths], *args)


def run_train_stage(args: argparse.Namespace) -> dict:
    _check_positive(args, ("vocab_size", "batch_size", "max_len", "total_tokens"))
    if args.minutes <= 0 or args.held_out_shards < 0 or args.lr <= 0 or args.vocab_background < 0:
        raise AccheadError("--minutes and --lr must be > 0, --held-out-shards and --vocab-background >= 0")
    feature = args.features is not None
    if feature and args.teacher:
        raise AccheadError("--teacher labels carry no target states: a feature draft trains without them")
    spec = args.layers or ("" if feature else "0,29")  # a feature draft: the target's last layer
    try:
        layers = tuple(int(x) for x in spec.split(",")) if spec else None
    except ValueError:
        raise AccheadError(f"--layers takes comma-separated layer indices (got {args.layers!r})") from None
    from acchead.assets import TARGET_DIR_NAME, asset_path
    from acchead.distill.draft import (
        INDEPENDENT,
        TRAINING_FILE,
        TrainConfig,
        build_vocabulary,
        coverage,
        init_from_target,
        pack_examples,
        train_draft,
    )
    from acchead.distill.responses import load_responses
    from acchead.distill.teacher import load_teacher, pack_teacher
    from acchead.models import load_causal_lm, load_tokenizer

    shards = load_responses(args.responses)
    if len(shards) <= args.held_out_shards:
        raise AccheadError(
            f"{args.responses} holds {len(shards)} shards: too few to hold out {args.held_out_shards}"
        )
    train_shards = shards[: len(shards) - args.held_out_shards]
    held_shards = shards[len(shards) - args.held_out_shards :]
    teacher = []
    for directory in args.teacher:
        found = load_teacher(directory)
        if not found:
            raise AccheadError(f"--teacher {directory}: no teacher shards there (acchead-distill teacher)")
        teacher += found
    target_path = args.target or asset_path(TARGET_DIR_NAME)
    tok = load_tokenizer(target_path)
    resuming = (args.out / "checkpoint.pt").is_file()
    if resuming or args.init is not None:
        draft = load_causal_lm(args.out / "draft" if resuming else args.init)
    else:
        target = load_causal_lm(target_path)
        layers = layers or (target.config.num_hidden_layers - 1,)
        if max(layers) >= target.config.num_hidden_layers:
            raise AccheadError(
                f"--layers {args.layers}: the target has {target.config.num_hidden_layers} layers"
            )
        background = (
            _assistant_token_counts(tok, args.vocab_background) if args.vocab_background else Counter()
        )
        for shard in teacher:  # the target's argmax on other text: the tokens it writes, beyond the responses
            background.update(t for labels in shard.labels for t in labels)
        try:
            vocab = build_vocabulary(train_shards, args.vocab_size, (tok.eos_token_id,), background)
        except ValueError as e:
            raise AccheadError(f"--vocab-size {args.vocab_size}: {e}") from None
        # the shipped draft reads the embedding from the installed asset; any other from the target's path
        source = f"asset:{TARGET_DIR_NAME}" if args.target is None else str(Path(target_path).resolve())
        draft = init_from_target(target, vocab, layers, embedding_source=source, feature=feature)
        del target
    to_draft = draft.lm_head.to_draft.cpu()
    config = TrainConfig(
        lr=args.lr, batch_size=args.batch_size, max_len=args.max_len, total_tokens=args.total_tokens,
        checkpoint_seconds=args.checkpoint_minutes * 60,
    )  # fmt: skip
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    if feature:
        from acchead.distill.feature_training import feature_objective, pack_feature_examples

        objective = feature_objective()
        pack = partial(_pack_with_states, args.features, pack_feature_examples)
    else:
        objective, pack = INDEPENDENT, (lambda directory, shards, *a: pack_examples(shards, *a))
    every = sorted(args.responses.glob("shard-*.npz"))
    train = pack(args.responses, every[: len(train_shards)], train_shards, to_draft, args.max_len)
    train += pack_teacher(teacher, to_draft, args.max_len)
    held_out = pack(args.responses, every[len(train_shards) :], held_shards, to_draft, args.max_len)
    draft = _to_device(draft, args.device)
    start = None
    if not resuming and args.init is not None and (args.init / TRAINING_FILE).is_file():
        start = json.loads((args.init / TRAINING_FILE).read_text())
    state = train_draft(
        draft,
        train,
        held_out,
        args.out,
        config,
        pad,
        max_seconds=args.minutes * 60,
        start_state=start,
        tokenizer=tok,
        objective=objective,
    )
    for directory in args.eval:
        shards = load_responses(directory)
        examples = pack(directory, sorted(directory.glob("shard-*.npz")), shards, to_draft, args.max_len)
        state[f"agreement_{directory.name}"] = round(objective.agreement(draft, examples, pad), 4)
        state[f"coverage_{directory.name}"] = round(coverage(shards, draft.lm_head.to_full.cpu()), 4)
    state["train_examples"] = len(train)
    state["coverage_held_out"] = round(coverage(held_shards, draft.lm_head.to_full.cpu()), 4)
    return state


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.threads is not None:
            import torch

            torch.set_num_threads(args.threads)
        from acchead.models import check_device

        check_device(args.device)  # a bad --device fails here, before prompts and models are loaded
        stages = {"responses": run_responses_stage, "teacher": run_teacher_stage, "cost": run_cost_stage,
                  "features": run_features_stage,
                  "train": run_train_stage}  # fmt: skip
        summary = stages[args.stage](args)
    except AccheadError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    print(" ".join(f"{k}={v}" for k, v in summary.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
