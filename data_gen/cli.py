"""`acchead-gen-data`: label target samples with exact acceptance probabilities (DESIGN §2).

One process: `acchead-gen-data [flags]`. Several processes or GPUs: `accelerate launch [--num_processes N]
-m acchead.data_gen.cli [flags]` (or `accelerate launch $(which acchead-gen-data) ...`); each process labels a
share of the run's batches (`PartialState.split_between_processes`) and the main process merges them.
Because the batches (planned once over all prompts) and every prompt's random streams are fixed by the
run's settings, the rows are the same for any number of processes and across interruptions (rerun the same
command to resume; `acchead.data_gen.shards` says what a kill can lose).

Two kinds of job: the target samples each prompt's response itself (online, `Labeler.label`), or the
responses come from elsewhere, a serving engine, and both models run teacher-forced over them
(`--responses`, `Labeler.label_responses`, `acchead.data_gen.responses`). Past the labelling call they are
one pipeline: mixing, features, shards, resumption and the merge do not know which ran.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from acchead.data_gen.config import GenDataArgs, parse_args
from acchead.data_gen.placement import Placement, placement
from acchead.data_gen.prompts import encode_prompts, fit_to_context, load_prompts, prompts_digest
from acchead.data_gen.responses import (
    Responses,
    emit_responses,
    encode_responses,
    read_responses,
    responses_digest,
    select_responses,
    skip_message,
)
from acchead.errors import AccheadError, cli_errors

CACHE_AUTO_LIMIT = 4 * 2**30  # bytes: auto caches features if the estimated float16 cache is at most this


def _model_paths(args: GenDataArgs) -> tuple[str | Path, str | Path]:
    from acchead.pairs import resolve_pair

    pair = resolve_pair(args.pair, args.target, args.draft)
    return pair.target, pair.draft


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


@dataclass
class Job:
    """What one run labels, by prompt index (the key of its random streams and its rows).

    Attributes:
        prompt_ids: index -> prompt tokens, for every index of the input (labelled or skipped).
        responses: index -> the response X to label (--responses), or None: the target samples X.
        kept: the indices to label.
        lengths: index -> the length batches are planned by (prompt, or prompt + response).
        positions: the most response positions the run can label (sizes the feature cache).
        identity: the run-identity entries of the input (`RunDir` settings).
        prompts: gen_config's "prompts" entry.
        extra: further gen_config entries ("responses").
        notes: lines for stderr when the run starts.
    """

    prompt_ids: Mapping[int, list[int]]
    responses: Mapping[int, list[int]] | None
    kept: list[int]
    lengths: Mapping[int, int]
    positions: int
    identity: dict
    prompts: dict
    extra: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _chain(args: GenDataArgs, draft) -> dict:
    """The run's `feature_chain` setting where it changes the labels (a feature draft, N > 1): absent
    otherwise, so runs that label first candidates keep the identity they always had."""
    from acchead.feature_draft import is_feature_draft  # here: --help imports no torch

    return {"feature_chain": args.feature_chain} if args.feature_chain > 1 and is_feature_draft(draft) else {}


def _prompts_job(args: GenDataArgs, prompt_ids: list[list[int]], vocab: int, context: int) -> Job:
    """Online labelling: prompts that leave room for max_new_tokens in the context; the target samples X."""
    bad = next(((i, t) for i, ids in enumerate(prompt_ids) for t in ids if not 0 <= t < vocab), None)
    if bad is not None:  # a tokenizer that does not fit the models: one line, not an IndexError mid-run
        raise AccheadError(f"prompt {bad[0]} has token id {bad[1]}, outside the models' embedding tables "
                           f"(ids 0..{vocab - 1}): the tokenizer does not fit the models")  # fmt: skip
    kept = fit_to_context(prompt_ids, args.max_new_tokens, context)
    skipped = len(prompt_ids) - len(kept)
    if not kept:
        raise AccheadError(
            f"all {len(prompt_ids)} prompts leave no room for {args.max_new_tokens} new tokens "
            f"in the {context}-token context"
        )
    digest = prompts_digest(prompt_ids)
    notes = [f"skipping {skipped} prompts too long for {args.max_new_tokens} new tokens in a "
             f"{context}-token context"] if skipped else []  # fmt: skip
    return Job(
        prompt_ids=dict(enumerate(prompt_ids)),
        responses=None,
        kept=kept,
        lengths={i: len(ids) for i, ids in enumerate(prompt_ids)},
        positions=len(kept) * args.max_new_tokens,
        identity={"prompts": digest, "num_prompts": len(prompt_ids)},
        prompts={
            **args.source.describe(),
            "chat_template": args.chat_template,
            "num_prompts": len(prompt_ids),
            "skipped_too_long": skipped,
            "sha256_16": digest,
        },
        notes=notes,
    )


def _responses_job(args: GenDataArgs, data: Responses, vocab: int, eos: list[int], context: int) -> Job:
    """Labels for given responses: those that can be labelled as the target's X (the rest counted)."""
    picked, skipped = select_responses(
        data, vocab_size=vocab, eos_ids=eos, max_new_tokens=args.max_new_tokens, context=context
    )
    total = len(data.indices)
    message = skip_message(skipped, total)
    if not picked:
        raise AccheadError(f"no response can be labelled: {message}")
    idx = data.indices
    kept = [idx[k] for k in picked]
    responses = {idx[k]: data.responses[k] for k in picked}
    prompt_ids = {i: p for i, p in zip(idx, data.prompts, strict=True)}
    digest = responses_digest(kept, [prompt_ids[i] for i in kept], [responses[i] for i in kept])
    eos_set = set(eos)
    ending = sum(responses[i][-1] in eos_set for i in kept)
    notes = [message] if message else []
    if not ending:
        notes.append(
            f"no labelled response ends with an EOS token ({eos}): the positions where the target stops go "
            "unlabelled; give response_ids with the EOS id where the engine stopped on it"
        )
    return Job(
        prompt_ids=prompt_ids,
        responses=responses,
        kept=kept,
        lengths={i: len(prompt_ids[i]) + len(responses[i]) for i in kept},
        positions=sum(len(responses[i]) for i in kept),
        identity={"prompts": digest, "num_prompts": total, "from_responses": True, "skipped": skipped},
        prompts={
            **args.source.describe(),
            "chat_template": args.chat_template,
            "num_prompts": total,
            "skipped_too_long": skipped["too_long"] + skipped["over_context"],
            "sha256_16": digest,
        },
        extra={
            "responses": {
                "labelled": len(kept),
                "skipped": skipped,
                "ending_with_eos": ending,
                "given_as": data.kinds,
            }
        },
        notes=notes,
    )


def process_placement(args: GenDataArgs, state) -> Placement:
    """This process's model placement (`acchead.data_gen.placement`) from its local rank and the GPUs."""
    import torch

    # Processes on this node: torchrun (behind `accelerate launch`) says; a single process is alone.
    local = int(os.environ.get("LOCAL_WORLD_SIZE", state.num_processes))
    return placement(
        args.device_map,
        args.process_gpus,
        state.local_process_index,
        local,
        torch.cuda.device_count(),
        lambda gpu: torch.cuda.mem_get_info(gpu)[0],
    )


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
    from acchead.data_gen.part_writer import PartWriter
    from acchead.data_gen.shards import TOKEN_EMBEDDINGS, RunDir, plan_batches, write_npy
    from acchead.models import check_tokenizers_match, load_causal_lm, load_tokenizer, model_identity

    state = PartialState()
    target_path, draft_path = _model_paths(args)

    target_tok, draft_tok = load_tokenizer(target_path), load_tokenizer(draft_path)
    check_tokenizers_match(target_tok, draft_tok)
    # Input first, models second: bad input is reported before minutes of loading a large target.
    if args.from_responses:
        records = read_responses(args.source, limit=args.num_prompts or None)  # type: ignore[arg-type]
        data = encode_responses(records, target_tok, chat_template=args.chat_template)
    else:
        prompts = load_prompts(args.source, limit=args.num_prompts or None)  # type: ignore[arg-type]
        prompt_ids = encode_prompts(prompts, target_tok, chat_template=args.chat_template)

    place = process_placement(args, state)
    device = args.device or place.draft_device or str(state.device)
    target = load_causal_lm(
        target_path, args.dtype, device=device, device_map=place.device_map, max_memory=place.max_memory
    )
    draft = load_causal_lm(draft_path, args.dtype, device=device)
    if place.max_memory is not None:  # one line per process: which GPUs its copy of the target took
        gpus = sorted({d for d in getattr(target, "hf_device_map", {}).values() if isinstance(d, int)})
        print(
            f"gen-data process {state.process_index}: target over GPUs {gpus} (budget on "
            f"{sorted(place.max_memory)}), draft on {device}",
            file=sys.stderr,
        )
    context = min(context_length(target, target_tok), context_length(draft, draft_tok))
    eos = eos_ids(target, target_tok)
    vocab = min(m.get_input_embeddings().weight.size(0) for m in (target, draft))
    if args.from_responses:
        job = _responses_job(args, data, vocab, eos, context)
    else:
        job = _prompts_job(args, prompt_ids, vocab, context)
    target_id, draft_id = model_identity(target), model_identity(draft)
    hidden = draft_id["hidden_size"]
    # Both head kinds' states: (1 - r) of the positions for candidate heads, all of them for lookahead heads.
    estimate = job.positions * (2 - args.mix_ratio) * hidden * 2
    cache = args.cache_features == "on" or (args.cache_features == "auto" and estimate <= CACHE_AUTO_LIMIT)

    settings = {
        "target": _anonymous(target_id),
        "draft": _anonymous(draft_id),
        "dtype": args.dtype,
        "device_type": target.device.type,  # CPU and CUDA kernels and RNGs differ: no mixing within one run
        "sampling": args.sampling.to_dict(),
        "mix_ratio": args.mix_ratio,
        **_chain(args, draft),
        "seed": args.seed,
        "max_new_tokens": args.max_new_tokens,
        "eos_ids": eos,
        "batch_size": args.batch_size,
        "cache_features": cache,
        "feature_kinds": ["candidate", "lookahead"] if cache else [],
        **job.identity,
        "context": context,
    }
    # Planned over the whole run, never per part: --shard-size, --flush-seconds and kills change when rows
    # reach the disk, never what is batched together (and so how labels and features are rounded).
    batches = plan_batches(job.kept, job.lengths, args.batch_size)
    run_dir = RunDir(args.out, settings, batches)
    gen_config = {
        "target": target_id,
        "draft": draft_id,
        "sampling": args.sampling.to_dict(),
        "mix_ratio": args.mix_ratio,
        **_chain(args, draft),
        "seed": args.seed,
        "max_new_tokens": args.max_new_tokens,
        "prompts": job.prompts,
        **job.extra,
    }

    stack.enter_context(run_dir.locked(state, overwrite=args.overwrite))
    if run_dir.status() == "complete":
        if not state.is_main_process:
            return {}
        _summary(run_dir.load_gen_config(), run_dir.out, note="already complete")
        _emit(args, run_dir.out)
        return run_dir.load_gen_config()
    pending = run_dir.pending()  # listed before the barrier: no process writes a shard until all have listed
    if state.is_main_process:
        run_dir.start()
        for note in job.notes:
            print(note, file=sys.stderr)
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
        feature_chain=args.feature_chain,
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
            prompt_batch = [job.prompt_ids[i] for i in batch]
            if job.responses is None:
                rows = labeler.label(batch, prompt_batch)
            else:
                rows = labeler.label_responses(batch, prompt_batch, [job.responses[i] for i in batch])
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
        from acchead.models import output_embedding_table

        # The lookahead head rebuilds each candidate's logits from its state: state @ out_emb.T.
        out_emb = output_embedding_table(draft).float().cpu().numpy()  # (V, H)
        write_npy(run_dir.out / TOKEN_EMBEDDINGS, out_emb)
    result = run_dir.merge(gen_config, hidden if cache else None)
    _summary(result, run_dir.out)
    _emit(args, run_dir.out)
    return result


def _emit(args: GenDataArgs, out: Path) -> None:
    """--emit-responses: the finished run's target responses, in the --responses format."""
    if args.emit_responses is not None:
        n = emit_responses(args.emit_responses, out)
        print(f"gen-data: wrote {n} responses to {args.emit_responses}", file=sys.stderr)


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
