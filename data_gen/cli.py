"""`acchead-gen-data`: label target samples with exact acceptance probabilities (DESIGN §2).

One process: `acchead-gen-data [flags]`. Several processes or GPUs: `accelerate launch [--num_processes N]
-m acchead.data_gen.cli [flags]` (or `accelerate launch $(which acchead-gen-data) ...`); each process labels a
share of the run's batches (`PartialState.split_between_processes`) and the main process merges them.
Because the batches (planned once over all prompts) and every prompt's random streams are fixed by the
run's settings, the rows are the same for any number of processes and across interruptions (rerun the same
command to resume; `acchead.data_gen.shards` says what a kill can lose).
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

from acchead.data_gen.config import GenDataArgs, parse_args
from acchead.data_gen.prompts import encode_prompts, fit_to_context, load_prompts, prompts_digest
from acchead.errors import AccheadError, cli_errors

CACHE_AUTO_LIMIT = 4 * 2**30  # bytes: auto caches features if the estimated float16 cache is at most this


def _model_paths(args: GenDataArgs) -> tuple[str | Path, str | Path]:
    from acchead.zoo import DRAFT_DIR, TARGET_DIR

    return args.target or TARGET_DIR, args.draft or DRAFT_DIR


def context_length(model, tokenizer) -> int:
    """Longest sequence the model handles: `max_position_embeddings`, else the tokenizer's limit."""
    n = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    if n is None:
        n = tokenizer.model_max_length if tokenizer.model_max_length < 10**9 else 10**9
    return int(n)


def eos_ids(model, tokenizer) -> list[int]:
    """Tokens that end a response: the target's generation config EOS ids, else the tokenizer's."""
    eos = model.generation_config.eos_token_id if model.generation_config is not None else None
    ids = [eos] if isinstance(eos, int) else list(eos or [])
    if not ids and tokenizer.eos_token_id is not None:
        ids = [tokenizer.eos_token_id]
    if not ids:
        raise AccheadError("the target defines no EOS token (generation_config or tokenizer)")
    return ids


def _anonymous(identity: dict) -> dict:
    """An identity without its informational name: moving a model directory does not change a run."""
    return {k: v for k, v in identity.items() if k != "name"}


def run(args: GenDataArgs, *, progress: bool = True) -> dict:
    """Run (or resume, or just report) one gen-data job; returns the gen_config of the finished dataset.

    Non-main processes return an empty dict once their parts are written. The main process holds OUT's
    lock from the claim to the merge.
    """
    with contextlib.ExitStack() as stack:
        return _run(args, progress, stack)


def _run(args: GenDataArgs, progress: bool, stack: contextlib.ExitStack) -> dict:
    # Deferred: torch, transformers and accelerate take seconds to import; `--help` and bad flags need none.
    from accelerate import PartialState
    from tqdm.auto import tqdm

    from acchead.data_gen.labeler import Labeler
    from acchead.data_gen.shards import TOKEN_EMBEDDINGS, PartWriter, RunDir, plan_batches, write_npy
    from acchead.models import check_tokenizers_match, load_causal_lm, load_tokenizer, model_identity

    state = PartialState()
    if args.device_map and state.num_processes > 1:
        raise AccheadError("--device-map shards one target over all GPUs; use it with a single process")
    device = args.device or str(state.device)
    target_path, draft_path = _model_paths(args)

    target_tok, draft_tok = load_tokenizer(target_path), load_tokenizer(draft_path)
    check_tokenizers_match(target_tok, draft_tok)
    prompts = load_prompts(args.source, limit=args.num_prompts or None)
    prompt_ids = encode_prompts(prompts, target_tok, chat_template=args.chat_template)

    target = load_causal_lm(target_path, args.dtype, device=device, device_map=args.device_map)
    draft = load_causal_lm(draft_path, args.dtype, device=device)
    context = min(context_length(target, target_tok), context_length(draft, draft_tok))
    kept = fit_to_context(prompt_ids, args.max_new_tokens, context)
    skipped = len(prompt_ids) - len(kept)
    if not kept:
        raise AccheadError(
            f"all {len(prompt_ids)} prompts leave no room for {args.max_new_tokens} new tokens "
            f"in the {context}-token context"
        )
    target_id, draft_id = model_identity(target), model_identity(draft)
    hidden = draft_id["hidden_size"]
    # Both head kinds' states: (1 - r) of the positions for candidate heads, all of them for lookahead heads.
    estimate = len(kept) * args.max_new_tokens * (2 - args.mix_ratio) * hidden * 2
    cache = args.cache_features == "on" or (args.cache_features == "auto" and estimate <= CACHE_AUTO_LIMIT)

    eos = eos_ids(target, target_tok)
    settings = {
        "target": _anonymous(target_id),
        "draft": _anonymous(draft_id),
        "dtype": args.dtype,
        "device_type": target.device.type,  # CPU and CUDA kernels and RNGs differ: no mixing within one run
        "sampling": args.sampling.to_dict(),
        "mix_ratio": args.mix_ratio,
        "seed": args.seed,
        "max_new_tokens": args.max_new_tokens,
        "eos_ids": eos,
        "batch_size": args.batch_size,
        "cache_features": cache,
        "feature_kinds": ["candidate", "lookahead"] if cache else [],
        "prompts": prompts_digest(prompt_ids),
        "num_prompts": len(prompt_ids),
        "context": context,
    }
    lengths = [len(ids) for ids in prompt_ids]
    # Planned over the whole run, never per part: --shard-size, --flush-seconds and kills change when rows
    # reach the disk, never what is batched together (and so how labels and features are rounded).
    batches = plan_batches(kept, lengths, args.batch_size)
    run_dir = RunDir(args.out, settings, batches)
    gen_config = {
        "target": target_id,
        "draft": draft_id,
        "sampling": args.sampling.to_dict(),
        "mix_ratio": args.mix_ratio,
        "seed": args.seed,
        "max_new_tokens": args.max_new_tokens,
        "prompts": {
            **args.source.describe(),
            "chat_template": args.chat_template,
            "num_prompts": len(prompt_ids),
            "skipped_too_long": skipped,
            "sha256_16": settings["prompts"],
        },
    }

    stack.enter_context(run_dir.locked(state, overwrite=args.overwrite))
    if run_dir.status() == "complete":
        if state.is_main_process:
            _summary(run_dir.load_gen_config(), run_dir.out, note="already complete")
        return run_dir.load_gen_config() if state.is_main_process else {}
    pending = run_dir.pending()  # listed before the barrier: no process writes a shard until all have listed
    if state.is_main_process:
        run_dir.start()
        if skipped:
            print(
                f"skipping {skipped} prompts too long for {args.max_new_tokens} new tokens in a "
                f"{context}-token context",
                file=sys.stderr,
            )
        if len(pending) < len(batches):
            print(
                f"resuming {run_dir.out}: {len(batches) - len(pending)}/{len(batches)} batches done",
                file=sys.stderr,
            )
    state.wait_for_everyone()

    labeler = Labeler(
        target,
        draft,
        args.sampling,
        mix_ratio=args.mix_ratio,
        seed=args.seed,
        max_new_tokens=args.max_new_tokens,
        eos_ids=eos,
        pad_id=target_tok.pad_token_id if target_tok.pad_token_id is not None else eos[0],
        cache_features=cache,
    )
    with state.split_between_processes(pending) as mine:
        total = sum(len(batches[b]) for b in mine)
        bar = tqdm(
            total=total,
            unit="prompt",
            desc="gen-data",
            disable=not progress or not state.is_main_process,
            dynamic_ncols=True,
        )
        tokens, t0 = 0, time.perf_counter()
        writer = PartWriter(run_dir, hidden if cache else None, args.shard_size, args.flush_seconds)
        for b in mine:
            batch = batches[b]
            rows = labeler.label(batch, [prompt_ids[i] for i in batch])
            writer.add(b, rows)
            tokens += sum(len(r.response_ids) for r in rows)
            bar.update(len(batch))
            bar.set_postfix_str(f"{tokens / (time.perf_counter() - t0):.0f} tok/s")
        writer.close()
        bar.close()
    state.wait_for_everyone()
    if not state.is_main_process:
        return {}
    if cache:
        # The lookahead head rebuilds each candidate's logits from its state: state @ out_emb.T.
        out_emb = draft.get_output_embeddings().weight.detach().float().cpu().numpy()  # (V, H)
        write_npy(run_dir.out / TOKEN_EMBEDDINGS, out_emb)
    result = run_dir.merge(gen_config, hidden if cache else None)
    _summary(result, run_dir.out)
    return result


def _summary(gen_config: dict, out: Path, note: str = "done") -> None:
    c = gen_config["counts"]
    feats = gen_config.get("features")
    cache = f"features {feats['shape'][0]}x{feats['shape'][1]} float16" if feats else "no feature cache"
    print(
        f"gen-data {note}: {c['rows']} rows, {c['positions']} positions ({c['draft_positions']} from draft), "
        f"mean label {c['mean_label']:.4f}, share of labels = 1: {c['share_label_one']:.4f}; {cache}; {out}"
    )


@cli_errors
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)  # before any heavy import: `--help` and bad flags answer at once
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # weight-loading bars: gen-data shows its own progress
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
