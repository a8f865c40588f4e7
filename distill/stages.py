"""The `acchead-distill` stages but training (`acchead.distill.train_stage`): each takes the arguments
`acchead.distill.cli` parsed and returns its summary (printed as key=value pairs), or raises `AccheadError`.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict

from acchead.errors import AccheadError


def check_positive(args: argparse.Namespace, names: tuple[str, ...]) -> None:
    for name in names:
        if getattr(args, name) < 1:
            raise AccheadError(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(args, name)})")


def run_responses_stage(args: argparse.Namespace) -> dict:
    check_positive(args, ("num_prompts", "max_new_tokens", "max_prompt_tokens", "batch_size",
                          "shard_prompts", "group_shards"))  # fmt: skip
    if args.code_every < 0:
        raise AccheadError("--code-every must be >= 0")
    if args.minutes is not None and args.minutes <= 0:
        raise AccheadError("--minutes must be > 0")
    import torch

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
    target = to_device(target, args.device).to(getattr(torch, args.dtype))
    config = ResponsesConfig(
        target=fingerprint, prompts=args.prompts, num_prompts=len(plan),
        code_every=args.code_every,
        max_new_tokens=args.max_new_tokens, max_prompt_tokens=args.max_prompt_tokens,
        shard_prompts=args.shard_prompts, heldout_chat=SHAREGPT_HELDOUT,
    )  # fmt: skip
    seconds = None if args.minutes is None else args.minutes * 60
    summary = run_responses(target, tok, plan, args.out, config, args.batch_size, max_seconds=seconds,
                            group_shards=args.group_shards)  # fmt: skip
    return {**asdict(config), **summary}


def run_teacher_stage(args: argparse.Namespace) -> dict:
    check_positive(args, ("num_exchanges", "max_len", "batch_size", "shard_exchanges"))
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
    target = to_device(target, args.device)
    return {**asdict(config), **run_teacher(target, tok, exchanges, args.out, config, args.batch_size)}


def run_features_stage(args: argparse.Namespace) -> dict:
    check_positive(args, ("batch_tokens",))
    from acchead.assets import TARGET_DIR_NAME, asset_path
    from acchead.distill.features import run_features, text_shards
    from acchead.models import load_causal_lm, native_bfloat16

    text = args.responses or args.teacher
    text_shards(text)  # a directory without shards is refused before the target loads
    target = to_device(load_causal_lm(args.target or asset_path(TARGET_DIR_NAME)), args.device)
    seconds = None if args.minutes is None else args.minutes * 60
    layers = parse_layers(args.fused_layers, "--fused-layers")
    bf16 = args.dtype == "bfloat16" or (args.dtype == "auto" and native_bfloat16(target.device))
    summary = run_features(target, text, args.out, args.batch_tokens, bf16, seconds, layers)
    return {"dtype": "bfloat16" if bf16 else "float32", **summary}


def parse_layers(spec: str | None, flag: str) -> tuple[int, ...]:
    """Comma-separated layer indices (`flag`'s value) → a tuple; "" or None → (); one line if malformed."""
    try:
        layers = tuple(int(x) for x in spec.split(",")) if spec else ()
    except ValueError:
        raise AccheadError(f"{flag} takes comma-separated layer indices (got {spec!r})") from None
    if len(set(layers)) != len(layers) or any(i < 0 for i in layers):
        raise AccheadError(f"{flag} {spec}: distinct layer indices >= 0")
    return layers


def to_device(model, device: str):
    """`model` on `device`, or a one-line error naming what is missing."""
    from acchead.models import check_device

    check_device(device)
    return model.to(device)


def run_cost_stage(args: argparse.Namespace) -> dict:
    check_positive(args, ("context", "calls", "rounds"))
    from acchead.models import load_causal_lm
    from acchead.pairs import resolve_pair
    from acchead.step_cost import measure_cost

    pair = resolve_pair(args.pair, args.target, args.draft)
    report = measure_cost(load_causal_lm(pair.target), load_causal_lm(pair.draft), args.context, args.calls,
                          args.rounds)  # fmt: skip
    for line in report.lines(args.goal):
        print(line)
    return asdict(report)
