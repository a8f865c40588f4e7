"""`acchead-decode`: speculative decoding of one prompt, streaming the text, then the round statistics.

    acchead-decode                                          # demo pair + shipped head at its h (0.8)
    acchead-decode --pair smollm2 --draft DIR --head FILE --prompt 'Write a haiku.'   # the real target
    acchead-decode --policy specdec:k=4 --verifier block --prompt 'def fib(n):'
    acchead-decode --target DIR --draft DIR --head head.safetensors --temperature 0.7 --top-p 0.9

Sampling flags left unset take the head's training configuration S (a head predicts acceptance under the
S its labels were computed with), or greedy decoding when no head is used.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from acchead.errors import AccheadError, DefaultsHelpFormatter, cli_errors
from acchead.inference.policy_spec import SpecDecPPSpec
from acchead.inference.spec import VERIFIERS, DecodingSpec
from acchead.pairs import DEFAULT_PAIR, PAIR_NAMES, default_heads, resolve_pair
from acchead.sampling import SamplingConfig

# torch, transformers and the decoders load in `main`, after the flags: `--help` must not wait for them.
if TYPE_CHECKING:
    import torch

    from acchead.inference.decoder import GenerationResult

DEFAULT_PROMPT = (
    'def is_palindrome(text: str) -> bool:\n    """Return True if text reads the same backwards."""\n'
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="acchead-decode",
        description="Decode one prompt with a speculative decoder, streaming the text and printing the "
        "round statistics (target/draft forwards, discarded drafts, wall time).",
        formatter_class=DefaultsHelpFormatter,
    )
    p.add_argument(
        "--pair", choices=PAIR_NAMES, default=DEFAULT_PAIR,
        help="the named pair whose models and shipped heads are the defaults (acchead.pairs)",
    )  # fmt: skip
    p.add_argument(
        "--target", default=None, help="target directory, .gguf file or hub id (default: the pair's)"
    )
    p.add_argument(
        "--draft", default=None, help="draft directory or hub id, same tokenizer (default: the pair's)"
    )
    p.add_argument(
        "--head",
        default=None,
        help="acceptance head file for specdecpp (default: the pair's shipped head trained under the "
        "requested sampling configuration; the greedy one, with a warning, if none is)",
    )
    p.add_argument(
        "--policy",
        default="specdecpp",
        help="stop policy (acchead.inference.policy_spec): autoregressive | specdec:k=K | "
        "specdecpp[:h=H,max=M,free=0/1] (no h: the head's recorded threshold) | confidence:tau=T[,max=M] | "
        "entropy:tau=T[,max=M] | adaedl:lam=L[,gamma=G,adapt=0/1,max=M] | oracle (greedy only) | "
        "ucb:arms=SPEC|SPEC|... | exp3:arms=...; copy[:min=M,block=N,batch=N]+POLICY adds copy rounds where "
        "the context's suffix recurs (up to block tokens a round; in a --batch-size batch of R rows up to "
        "batch // R per row)",
    )
    p.add_argument(
        "--verifier",
        choices=VERIFIERS,
        default="token",
        help="token verification (Leviathan/Chen) or block verification (Sun et al.)",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", default=None, help="prompt text (default: a small function stub)")
    src.add_argument("--prompt-file", type=Path, default=None, help="read the prompt from this file")
    src.add_argument(
        "--prompts", default=None,
        help="with --batch-size B: B different prompts, the first of a set (humaneval, mtbench, ...) or a "
        ".jsonl file, cycled if fewer",
    )  # fmt: skip
    p.add_argument(
        "--chat", action="store_true", help="the prompt is a user's turn: put it through the target "
        "tokenizer's chat template (an instruct model, the smollm2 pair's target among them, then answers "
        "it; --prompts .jsonl lines say {\"chat\": true} themselves); default: plain text",
    )  # fmt: skip
    p.add_argument("--max-new-tokens", type=int, default=128, help="generate at most this many tokens")
    p.add_argument(
        "--truncate-prompt",
        action="store_true",
        help="keep only the last tokens of a prompt too long for the context (default: refuse it)",
    )
    p.add_argument(
        "--temperature", type=float, default=None, help="0 = greedy; default: the head's training S, else 0"
    )
    p.add_argument("--top-k", type=int, default=None, help="keep the k most likely tokens (0 = off)")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass (1 = off)")
    p.add_argument("--seed", type=int, default=0, help="seed of every random draw (repeatable output)")
    p.add_argument("--dtype", default="float32", help="model dtype: float32 | float16 | bfloat16")
    p.add_argument(
        "--device", default="auto", help="device for both models (auto: cuda if available, else cpu)"
    )
    p.add_argument(
        "--fast",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="static KV caches and forwards compiled once per shape (CUDA graphs on a GPU); "
        "default: on for CUDA, off on the CPU, where compiling costs tens of seconds up front",
    )
    p.add_argument("--json", action="store_true", help="print the statistics as one JSON object")
    p.add_argument(
        "--batch-size", type=int, default=None, help="decode B rows at once: B copies of the prompt, or "
        "--prompts (row b: seed + b; acchead.inference.batched, no streaming; with --fast its forwards are "
        "compiled first, outside the timing); prints each row's text and the batch's counts",
    )
    p.add_argument(
        "--batch-stop", default="on", help="with --batch-size and a specdecpp policy: the batch stop rule, "
        "on (c = 1 - h), measured (c(B) timed on this machine first), gated (measured, and before each round "
        "the round gate: draft only while drafting finishes the batch sooner), off, or a cost ratio c "
        "(default on)",
    )
    return p


def _read_prompt(args: argparse.Namespace) -> str:
    if args.prompt_file is not None:
        if not args.prompt_file.is_file():
            raise AccheadError(f"prompt file not found: {args.prompt_file}")
        try:
            return args.prompt_file.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise AccheadError(f"prompt file {args.prompt_file} is not UTF-8 text (byte {e.start})") from None
    return DEFAULT_PROMPT if args.prompt is None else args.prompt


def _sampling(args: argparse.Namespace, head_s: SamplingConfig | None) -> SamplingConfig:
    base = head_s or SamplingConfig(temperature=0.0)
    try:
        return SamplingConfig(
            temperature=base.temperature if args.temperature is None else args.temperature,
            top_k=base.top_k if args.top_k is None else args.top_k,
            top_p=base.top_p if args.top_p is None else args.top_p,
        )
    except ValueError as e:
        raise AccheadError(str(e)) from None


def _fit_prompt(
    ids: torch.Tensor, max_new_tokens: int, models: list, truncate: bool
) -> tuple[torch.Tensor, int | None]:
    """Make the prompt fit the models' context with `max_new_tokens` to generate.

    Returns (ids, None) when it fits. When it does not: with `--truncate-prompt`, its last tokens and its
    original length (and says so on stderr); without, one AccheadError line naming the flag.
    """
    from acchead.models import check_prompt, context_length

    limits = [c for c in map(context_length, models) if c is not None]
    keep = min(limits) - max_new_tokens if limits else ids.numel()
    if ids.numel() <= keep or not truncate:
        check_prompt(ids, max_new_tokens, models, "; pass --truncate-prompt to keep its last tokens")
        return ids, None
    if keep < 1:
        raise AccheadError(f"--max-new-tokens {max_new_tokens} fills the whole {min(limits)}-token context")
    print(f"acchead-decode: prompt truncated from {ids.numel()} to its last {keep} tokens", file=sys.stderr)
    return ids[-keep:], int(ids.numel())


def format_stats(res: GenerationResult) -> str:
    """One line of the counts the cost model uses, plus wall-clock speed."""
    tps = res.tokens / res.wall_time if res.wall_time > 0 else float("nan")
    mean_acc = sum(res.accepted_per_round) / max(res.rounds, 1)
    return (
        f"tokens {res.tokens} | rounds {res.rounds}"
        + (f" ({res.copied_rounds} copied)" if res.copied_rounds else "")
        + f" | target calls {res.target_calls} | "
        f"draft calls {res.draft_calls} | discarded {res.discarded} | accepted/round {mean_acc:.2f} | "
        f"verification rate {res.verification_rate:.3f} | discard rate {res.discard_rate:.3f} | "
        f"{res.wall_time:.2f} s, {tps:.1f} tokens/s"
    )


def _check_cheap_flags(args: argparse.Namespace) -> None:
    """The flags that need no model, refused in one line before any loads (seconds, on a CPU)."""
    from acchead.inference.batch_stop import parse_batch_stop
    from acchead.models import check_device, parse_dtype

    if args.batch_size is not None and args.batch_size < 1:
        raise AccheadError(f"--batch-size must be >= 1, got {args.batch_size}")
    _sampling(args, None)  # temperature, top-k and top-p in range, whether or not a head is needed
    parse_batch_stop(args.batch_stop, 0.5)
    parse_dtype(args.dtype)
    if args.device != "auto":
        check_device(args.device)


def _decode_batch(args: argparse.Namespace, target, draft, spec: DecodingSpec, tok, rows: list) -> int:
    """`--batch-size B`: B rows of (T_b,) ids in one batch (issue 33), each row's text, the batch's counts."""
    from acchead.inference.batched import BatchedDecoder

    s = spec.sampling
    assert s is not None, "main resolves S before decoding"
    rule = args.batch_stop if isinstance(spec.policy, SpecDecPPSpec) else False
    dec = BatchedDecoder(target, draft, batch_stop=rule, spec=spec)
    longest = max(len(r) for r in rows) + args.max_new_tokens
    warm_s = dec.warm_up(len(rows), longest, **s.to_dict())  # 0.0 when eager
    res = dec.generate(rows, max_new_tokens=args.max_new_tokens,
                       temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, seed=args.seed,
                       eos_token_id=tok.eos_token_id)  # fmt: skip
    stats = {k: v for k, v in res.to_dict().items() if k != "rows"}
    stats.update(batch_size=args.batch_size, policy=dec.policy.spec, verifier=args.verifier,
                 batch_stop=str(dec.batch_stop) if dec.batch_stop else None, sampling=s.to_dict(),
                 warm_up_s=warm_s, texts=[tok.decode(r.new_ids) for r in res.rows])  # fmt: skip
    if args.json:
        print(json.dumps(stats))
        return 0
    for b, text in enumerate(stats["texts"]):
        print(f"--- row {b} (seed {args.seed + b})\n{text}")
    rule = stats["batch_stop"] or "no batch rule"
    copying = f"{dec.copy.to_spec()}+" if dec.copy is not None else ""
    print(f"--- {copying}{dec.policy.spec}, {args.verifier} verification, {s}, B = {args.batch_size}, {rule}")
    print(f"tokens {res.tokens} | target calls {res.target_calls} | draft calls {res.draft_calls} | "
          + (f"copied rounds {res.copied_rounds} | " if dec.copy is not None else "")
          + f"batch stops {res.batch_stops} | {res.wall_time:.2f} s, {res.wall_tokens_per_s:.1f} tokens/s")
    return 0


@cli_errors
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.max_new_tokens < 1:
        raise AccheadError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    _check_cheap_flags(args)
    texts = None
    if args.prompts is not None:  # checked before any model loads
        if args.chat:
            raise AccheadError("--chat applies to --prompt / --prompt-file: a set's chat prompts and "
                               "{\"chat\": true} lines of a --prompts file go through the template already")
        if args.batch_size is None:
            raise AccheadError("--prompts decodes a batch of different prompts: add --batch-size B")
        from acchead.prompt_sources import load_prompts

        texts = load_prompts(args.prompts, max(args.batch_size, 1))
        if not texts:
            raise AccheadError(f"--prompts {args.prompts}: no prompts there")
    prompt = _read_prompt(args)
    # A bad spec fails before any model is loaded.
    path = None if args.fast is None else "fast" if args.fast else "eager"
    spec = DecodingSpec.from_spec(args.policy, verifier=args.verifier, path=path)
    head_path = None
    if not spec.needs_head:
        # So does an oracle with sampling.
        from acchead.inference.policy_build import parse_policy

        policy = parse_policy(spec.policy)
        if policy.greedy_only and args.temperature not in (None, 0.0):
            raise AccheadError(f"policy {policy.spec!r} is a greedy-only hindsight bound; use temperature 0")
    else:
        # Resolved here, not in the decoder: without --head, the pair's shipped head trained under the
        # requested S (greedy when no sampling flag is given), else its greedy head.
        sampling = _sampling(args, None)
        shipped = default_heads(args.pair, sampling) if args.head is None else []
        if args.head is None and not shipped:
            raise AccheadError(
                f"the {args.pair} pair ships no acceptance head for {sampling}: pass --head (acchead-train)"
            )
        head_path = Path(args.head) if args.head is not None else shipped[0]
        if not head_path.exists():
            raise AccheadError(
                f"no acceptance head at {head_path}; train one (acchead-train) and pass "
                "--head, or pick another --policy such as specdec:k=4"
            )
    pair = resolve_pair(args.pair, args.target, args.draft)
    args.target, args.draft = pair.target, pair.draft
    import torch
    from transformers import TextStreamer
    from transformers.utils import logging as hf_logging

    from acchead.inference.decoder_factory import build_decoder
    from acchead.models import check_tokenizers_match, load_causal_lm, load_tokenizer
    from acchead.prompting import encode_prompt

    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    hf_logging.disable_progress_bar()  # weight-loading bars would interleave with the streamed text
    tok = load_tokenizer(args.target)
    check_tokenizers_match(tok, load_tokenizer(args.draft))
    target = load_causal_lm(args.target, dtype=args.dtype, device=args.device)
    draft = load_causal_lm(args.draft, dtype=args.dtype, device=args.device)
    spec = replace(spec, head=None if head_path is None else str(head_path))
    decoder = build_decoder(spec, target, draft)
    s = _sampling(args, decoder.head_meta.sampling_config if decoder.head_meta is not None else None)
    spec = replace(spec, sampling=s)
    if texts is not None:  # B rows: the prompts (chat ones through the template), cycled to B
        from acchead.prompt_sources import encode_prompts

        enc, _ = encode_prompts(texts, tok, target, draft, args.max_new_tokens, args.device,
                                args.truncate_prompt)  # fmt: skip
        rows = [enc[b % len(enc)][0] for b in range(args.batch_size)]
        return _decode_batch(args, target, draft, spec, tok, rows)
    ids = torch.tensor(encode_prompt(tok, prompt, chat=args.chat), dtype=torch.long)
    if ids.numel() == 0:
        raise AccheadError("the prompt encodes to no tokens")
    ids, truncated_from = _fit_prompt(ids, args.max_new_tokens, [target, draft], args.truncate_prompt)
    if args.batch_size is not None:
        return _decode_batch(args, target, draft, spec, tok, [ids] * args.batch_size)
    # On the fast path: compile the units (or load them from the store of compiled units) before the
    # streamed, timed decode, so its tokens/s is the decode's own (a priced SpecDec++ also reads the widths
    # warm_up times); eager: nothing to do.
    start = time.perf_counter()
    decoder.warm_up(ids.numel() + args.max_new_tokens, **s.to_dict())
    warm_s = time.perf_counter() - start if decoder.fast else 0.0
    streamer = None if args.json else TextStreamer(tok, skip_prompt=False)
    res = decoder.generate(
        ids,
        max_new_tokens=args.max_new_tokens,
        temperature=s.temperature,
        top_k=s.top_k,
        top_p=s.top_p,
        seed=args.seed,
        eos_token_id=tok.eos_token_id,
        streamer=streamer,
    )
    if args.json:
        stats = {k: v for k, v in res.to_dict().items() if k != "new_ids"}
        stats.update(
            text=tok.decode(res.new_ids),
            policy=decoder.policy.spec,
            verifier=args.verifier,
            sampling=s.to_dict(),
            prompt_tokens=int(ids.numel()),
            prompt_truncated_from=truncated_from,
            warm_up_s=warm_s,
        )
        print(json.dumps(stats))
    else:
        warm = f" | fast path warmed up in {warm_s:.1f} s" if decoder.fast else ""
        drafter = f"{spec.drafter.to_spec()}+" if spec.drafter is not None else ""  # copy rounds, say
        print(f"\n--- {drafter}{decoder.policy.spec}, {args.verifier} verification, {s}{warm}")
        print(format_stats(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
