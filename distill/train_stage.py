"""`acchead-distill train`: the draft's training stage (the arguments `acchead.distill.cli` parsed).

It gathers what `acchead.distill.draft.train_draft` needs: the response shards (the last `--held-out-shards`
held out), the optional teacher labels, the draft (resumed from the run directory, or `--init`, or built
from the target with a vocabulary ranked by the responses), and for a feature draft the target's states
beside every response (stored by `acchead-distill features` and read from `--features`, or computed in
memory by the target when the stage starts, `--target-states`), then reports agreement on each `--eval` set.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path

from acchead.distill.stages import check_positive, parse_layers, to_device
from acchead.errors import AccheadError

# A feature draft's eval sets are scored at the depths of a round's first candidates too (later ones read
# its own states): agreement_by_depth_<set> in the summary.
EVAL_DEPTHS = 4

# Tokens per target forward of `--target-states` (padding included): the features stage's CPU default; a
# GPU takes a shard or more per forward.
STATES_BATCH_TOKENS = {"cpu": 3072, "cuda": 65536}


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


StatesReader = Callable[[Path, list[Path]], list]  # (directory, its shard paths) -> states per shard


def _states_reader(features: Path | None, target, layers: tuple[int, ...]) -> StatesReader:
    """Where a feature draft's target states come from: the files under `features` (`--features`, by
    directory name), or else `target` itself (`--target-states`: the loaded target, on the training device),
    run over each shard when it is packed (bfloat16 where `features --dtype auto` is): no stage, no files,
    for a GPU, where 4.6M tokens' states make 5.3 GB of files and the features stage wrote ~1 shard a second
    on an H200 (2026-11-28). `layers`: the draft's fused layers, whose outputs follow the final state (no
    default: a fused draft given the final state alone reads zeros in their columns without an error)."""
    from acchead.distill.features import load_features, shard_features, shard_sequences
    from acchead.models import native_bfloat16

    if features is not None:
        return lambda directory, paths: [
            load_features(features / Path(directory).name, p, layers) for p in paths
        ]
    from tqdm.auto import tqdm

    batch_tokens = STATES_BATCH_TOKENS.get(target.device.type, STATES_BATCH_TOKENS["cpu"])

    def compute(directory: Path, paths: list[Path]) -> list:
        name = Path(directory).name
        bar = tqdm(paths, desc=f"target states ({name})", unit="shard", disable=len(paths) < 2)
        bf16 = native_bfloat16(target.device)
        return [shard_features(target, shard_sequences(p), batch_tokens, bf16, layers) for p in bar]

    return compute


def _pack_with_states(
    read: StatesReader, pack, directory: Path, paths: list[Path], shards: list, *args
) -> list:  # fmt: skip
    """A feature draft's examples of `shards` (read from `paths` of `directory`), with the target's states
    from `read` (`_states_reader`)."""
    return pack(shards, read(directory, paths), *args)


def _pack_independent(directory: Path, paths: list[Path], shards: list, *args) -> list:
    """An independent draft's examples of `shards` (it reads no states: `directory` and `paths` unused)."""
    from acchead.distill.draft import pack_examples

    return pack_examples(shards, *args)


def _packer(read_states: StatesReader | None):
    """How a directory's response shards become examples: a feature draft's with the target's states from
    `read_states`, or (None) an independent draft's."""
    if read_states is None:
        return _pack_independent
    from acchead.distill.feature_training import pack_feature_examples

    return partial(_pack_with_states, read_states, pack_feature_examples)


def _init_schedule(args: argparse.Namespace) -> dict | None:
    """The state `--init`'s draft was exported with (its training.json), whose token count the schedule goes
    on from; None without --init, with --new-schedule, or for a draft without one. Refused when it has
    reached --total-tokens: the run would end at once, having trained nothing."""
    from acchead.distill.draft import TRAINING_FILE

    if args.init is None or args.new_schedule or not (args.init / TRAINING_FILE).is_file():
        return None
    start = json.loads((args.init / TRAINING_FILE).read_text())
    if start.get("tokens", 0) >= args.total_tokens:
        raise AccheadError(
            f"--init {args.init} was trained on {start['tokens']:,} labelled tokens, at or past "
            f"--total-tokens {args.total_tokens:,}: raise it (the schedule spans runs) or pass --new-schedule"
        )
    return start


def _fused_layers(args: argparse.Namespace, resuming: bool) -> tuple[int, ...]:
    """The target layers whose states the draft reads beside the final one: --fused-layers, else those of
    the draft it resumes or starts from (its config.json), else none. Refused if they differ from a resumed
    draft's, or from an --init draft's that already fuses others."""
    given = parse_layers(args.fused_layers, "--fused-layers") if args.fused_layers is not None else None
    source = args.out / "draft" if resuming else args.init
    config = source / "config.json" if source is not None else None
    have = ()
    if config is not None and config.is_file():
        have = tuple(json.loads(config.read_text()).get("fused_layers") or ())
    if given is None:
        return have
    if (have or resuming) and given != have:
        raise AccheadError(f"--fused-layers {args.fused_layers}: the draft in {source} reads {list(have)}")
    return given


def run_train_stage(args: argparse.Namespace) -> dict:
    check_positive(args, ("vocab_size", "batch_size", "max_len", "total_tokens"))
    if args.minutes <= 0 or args.held_out_shards < 0 or args.lr <= 0 or args.vocab_background < 0:
        raise AccheadError("--minutes and --lr must be > 0, --held-out-shards and --vocab-background >= 0")
    if args.features is not None and args.target_states:
        raise AccheadError("--features and --target-states are two sources of the target's states: pass one")
    feature = args.features is not None or args.target_states
    if args.chain < 1:
        raise AccheadError(f"--chain must be >= 1, got {args.chain}")
    for flag, value in (("--grow-layers", args.grow_layers), ("--grow-vocab", args.grow_vocab)):
        if value < 0 or (value and args.init is None):
            raise AccheadError(f"{flag} N (N >= 0) grows the --init draft: add --init")
    resuming = (args.out / "checkpoint.pt").is_file()
    start = None if resuming else _init_schedule(args)  # read (and refused) before anything loads
    fused = _fused_layers(args, resuming)
    if fused and not feature:
        raise AccheadError("--fused-layers: a feature draft's: add --features or --target-states")
    if (args.soft_labels or args.chain > 1 or args.cls_weight is not None) and not feature:
        raise AccheadError(
            "--soft-labels, --chain and --cls-weight train a feature draft: add --features or --target-states"
        )
    args.cls_weight = 0.1 if args.cls_weight is None else args.cls_weight
    if args.cls_weight <= 0:
        raise AccheadError(f"--cls-weight must be > 0 (got {args.cls_weight})")
    spec = args.layers or ("" if feature else "0,29")  # a feature draft: the target's last layer
    try:
        layers = tuple(int(x) for x in spec.split(",")) if spec else None
    except ValueError:
        raise AccheadError(f"--layers takes comma-separated layer indices (got {args.layers!r})") from None
    from acchead.assets import TARGET_DIR_NAME, asset_path
    from acchead.distill.draft import (
        INDEPENDENT,
        TrainConfig,
        build_vocabulary,
        coverage,
        fuse_layers,
        grow_layers,
        grow_vocabulary,
        init_from_target,
        train_draft,
    )
    from acchead.distill.responses import SHARD_GLOB, load_responses
    from acchead.distill.teacher import SHARD_GLOB as TEACHER_GLOB
    from acchead.distill.teacher import load_teacher, pack_teacher
    from acchead.models import load_causal_lm, load_tokenizer

    if not Path(args.responses).is_dir():
        raise AccheadError(f"--responses {args.responses}: no such directory (`acchead-distill responses` "
                           "writes one)")  # fmt: skip
    shards = load_responses(args.responses)
    if len(shards) <= args.held_out_shards:
        raise AccheadError(
            f"{args.responses} holds {len(shards)} shards: too few to hold out {args.held_out_shards}"
        )
    train_shards = shards[: len(shards) - args.held_out_shards]
    held_shards = shards[len(shards) - args.held_out_shards :]
    target_path = args.target or asset_path(TARGET_DIR_NAME)
    # --target-states: the target, loaded once, computes the states (and gives the soft labels' rows)
    states_target = to_device(load_causal_lm(target_path), args.device) if args.target_states else None
    read_states = _states_reader(args.features, states_target, fused) if feature else None
    teacher, teacher_states = [], []
    for directory in args.teacher:
        found = load_teacher(directory)
        if not found:
            raise AccheadError(f"--teacher {directory}: no teacher shards there (acchead-distill teacher)")
        teacher += found
        if read_states is not None:  # the target's states over the exchanges
            teacher_states += read_states(directory, sorted(Path(directory).glob(TEACHER_GLOB)))
    tok = load_tokenizer(target_path)
    if resuming or args.init is not None:
        draft = load_causal_lm(args.out / "draft" if resuming else args.init)
        if args.grow_layers and not resuming:
            draft = grow_layers(draft, args.grow_layers)
        if fused and not resuming:
            draft = fuse_layers(draft, fused)
        if args.grow_vocab and not resuming:  # the responses' most frequent tokens its head lacks
            have = draft.lm_head.to_full.cpu()
            try:
                ranked = build_vocabulary(train_shards, len(have) + args.grow_vocab, tuple(have.tolist()))
            except ValueError as e:
                raise AccheadError(f"--grow-vocab {args.grow_vocab}: {e}") from None
            draft = grow_vocabulary(draft, ranked[len(have) :])
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
        if fused:
            draft = fuse_layers(draft, fused)
        del target
    to_draft = draft.lm_head.to_draft.cpu()
    config = TrainConfig(
        lr=args.lr, batch_size=args.batch_size, max_len=args.max_len, total_tokens=args.total_tokens,
        checkpoint_seconds=args.checkpoint_minutes * 60,
    )  # fmt: skip
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    if feature:
        from acchead.distill.feature_training import feature_objective, pack_teacher_features

        rows = None
        if args.soft_labels:  # the target's head rows of the draft's vocabulary: its distribution on V_d
            source = states_target if states_target is not None else load_causal_lm(target_path)
            head = source.get_output_embeddings().weight.detach()
            rows = head[draft.lm_head.to_full.cpu()].float().to(args.device)
        objective = feature_objective(cls_weight=args.cls_weight, teacher_rows=rows, chain=args.chain)
        pack_extra = partial(pack_teacher_features, teacher, teacher_states)
    else:
        objective, pack_extra = INDEPENDENT, partial(pack_teacher, teacher)
    pack = _packer(read_states)
    every = sorted(args.responses.glob(SHARD_GLOB))
    train = pack(args.responses, every[: len(train_shards)], train_shards, to_draft, args.max_len)
    train += pack_extra(to_draft, args.max_len)
    held_out = pack(args.responses, every[len(train_shards) :], held_shards, to_draft, args.max_len)
    draft = to_device(draft, args.device)
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
    state.update(evaluate(draft, args.eval, pack, pad, args.max_len, feature))
    state["train_examples"] = len(train)
    state["coverage_held_out"] = round(coverage(held_shards, draft.lm_head.to_full.cpu()), 4)
    return state


def evaluate(draft, directories: list[Path], pack, pad: int, max_len: int, feature: bool) -> dict:
    """Per `--eval` responses directory: the draft's top-1 agreement with the target's tokens (a feature
    draft's also as the candidates 1..4 of a round, the later ones reading its own states; the first is
    its agreement) and the share of the tokens its vocabulary covers; `pack` makes a directory's examples
    as training packs them."""
    from acchead.distill.draft import INDEPENDENT, coverage
    from acchead.distill.feature_training import agreement_by_depth
    from acchead.distill.responses import SHARD_GLOB, load_responses

    to_draft, out = draft.lm_head.to_draft.cpu(), {}
    for directory in directories:
        shards = load_responses(directory)
        examples = pack(directory, sorted(directory.glob(SHARD_GLOB)), shards, to_draft, max_len)
        if feature:  # one chained forward per batch gives every depth, the first candidate's included
            by_depth = [round(a, 4) for a in agreement_by_depth(draft, examples, pad, EVAL_DEPTHS)]
            out[f"agreement_{directory.name}"] = by_depth[0]
            out[f"agreement_by_depth_{directory.name}"] = by_depth
        else:
            out[f"agreement_{directory.name}"] = round(INDEPENDENT.agreement(draft, examples, pad), 4)
        out[f"coverage_{directory.name}"] = round(coverage(shards, draft.lm_head.to_full.cpu()), 4)
    return out


def run_average_stage(args: argparse.Namespace) -> dict:
    """`acchead-distill average`: the weighted average of --drafts exported to --out (bf16, as `train`
    exports), then its agreement on each --eval set."""
    from acchead.assets import TARGET_DIR_NAME, asset_path
    from acchead.distill.average import average_drafts, training_record
    from acchead.distill.draft import export
    from acchead.feature_draft import is_feature_draft
    from acchead.models import load_causal_lm, load_tokenizer

    if args.out.exists() and any(args.out.iterdir()) and not args.overwrite:
        raise AccheadError(f"--out {args.out} is not empty: pass --overwrite to replace it")
    missing = [str(d) for d in args.drafts if not (d / "config.json").is_file()]
    if missing:
        raise AccheadError(f"--drafts: no draft directory at {', '.join(missing)}")
    draft, weights = average_drafts(args.drafts, args.weights)
    feature = is_feature_draft(draft)
    if args.eval and feature and args.features is None and not args.target_states:
        raise AccheadError(
            "--eval of a feature draft reads the target's states: add --features or --target-states"
        )
    tok = load_tokenizer(args.drafts[-1])
    export(draft, args.out, training_record(args.drafts, weights), tok)
    summary = {"out": str(args.out), "weights": [round(w, 6) for w in weights]}
    if not args.eval:
        return summary
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    draft = to_device(load_causal_lm(args.out), args.device)  # the exported (bf16-rounded) weights
    read_states = None
    if feature:  # the target is needed (and its asset resolved) only to compute states
        target = None
        if args.target_states:
            target = to_device(load_causal_lm(args.target or asset_path(TARGET_DIR_NAME)), args.device)
        read_states = _states_reader(args.features, target, tuple(draft.config.fused_layers))
    return {**summary, **evaluate(draft, args.eval, _packer(read_states), pad, args.max_len, feature)}
