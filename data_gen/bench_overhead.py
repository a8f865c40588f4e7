"""Benchmark (not a test): the cost of exact labelling relative to plain sampling from the target.

    python -m acchead.data_gen.bench_overhead [--num-prompts 32 --max-new-tokens 128 --temperature 0 ...]

labelling overhead = time(gen-data's labelling of the prompts, feature cache off)
                     / time(the target's `generate` of the same prompts, batches and lengths)

Both sides see the same batches (gen-data's length-sorted batching) and produce the same number of tokens:
`generate` is asked for exactly as many new tokens per batch as the longest labelled response in it
(`min_new_tokens = max_new_tokens`, so EOS cannot end it early). Batches alternate between the two sides
so that load from other processes on the machine hits both alike. On a shared CPU, wall time swings with
other jobs; the process's CPU time (one thread: `--threads 1`) does not, so both ratios are printed. Also
printed: our own sampling loop alone (the part `generate` replaces) and labelling with the feature cache.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from acchead.data_gen.cli import context_length, eos_ids
from acchead.data_gen.labeler import Labeler, left_pad, sample_and_label, stream_uniforms
from acchead.data_gen.prompts import PromptSource, encode_prompts, fit_to_context, load_prompts
from acchead.data_gen.shards import plan_batches
from acchead.errors import AccheadError, DefaultsHelpFormatter, cli_errors, thread_count
from acchead.models import check_tokenizers_match, load_causal_lm, load_tokenizer
from acchead.sampling import SamplingConfig
from acchead.step_cost import device_sync


def add_input_flags(p: argparse.ArgumentParser, num_prompts: int, mix_ratio: float, mix_help: str) -> None:
    """The flags both labelling benchmarks share: models, prompts, lengths, batch size, S and r."""
    a = p.add_argument
    a("--target", default=None, help="target model directory or hub id (default: the demo target)")
    a("--draft", default=None, help="draft model directory or hub id (default: the demo draft)")
    a("--prompt-set", default="stdlib-functions", help="built-in prompt set")
    a("--prompts", default=None, help="prompt file (.jsonl/.json/.parquet/.txt) instead of --prompt-set")
    a("--num-prompts", type=int, default=num_prompts, help="first N prompts")
    a("--max-new-tokens", type=int, default=128, help="response length cap")
    a("--batch-size", type=int, default=16, help="prompts per batch (both modes)")
    a("--temperature", type=float, default=0.0, help="S: 0 = greedy")
    a("--top-k", type=int, default=0, help="S: top-k (0 = off)")
    a("--top-p", type=float, default=1.0, help="S: nucleus mass (1.0 = off)")
    a("--mix-ratio", type=float, default=mix_ratio, help=mix_help)
    a("--device", default="cpu", help="torch device for both models")
    a("--dtype", default="float32", help="model dtype")
    a("--threads", type=thread_count, default=0, help="torch CPU threads (0 = torch's default)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m acchead.data_gen.bench_overhead",
        description="Time gen-data labelling against the target's plain `generate` on the same prompts and "
        "lengths; prints the ratio (goal <= 1.5x).",
        formatter_class=DefaultsHelpFormatter,
    )
    add_input_flags(p, num_prompts=32, mix_ratio=0.15, mix_help="r")
    return p


def timed(device: torch.device, fn, *args, **kwargs) -> tuple[np.ndarray, object]:
    """([wall seconds, process CPU seconds], result) of fn(*args, **kwargs), waiting on `device` around it."""
    device_sync(device)
    w0, c0 = time.perf_counter(), time.process_time()
    result = fn(*args, **kwargs)
    device_sync(device)
    return np.array([time.perf_counter() - w0, time.process_time() - c0]), result


@dataclass
class BenchInputs:
    """What both labelling benchmarks load from their flags."""

    tok: Any
    target: Any
    draft: Any
    target_path: Any
    draft_path: Any
    prompt_ids: list[list[int]]
    kept: list[int]  # indices of the prompts that fit the context with --max-new-tokens
    sampling: SamplingConfig
    eos: list[int]

    def labeler(self, args: argparse.Namespace, cache_features: bool) -> Labeler:
        """The gen-data labeler both benchmarks time: the flags' S, r and length, seed 0."""
        return Labeler(
            self.target,
            self.draft,
            self.sampling,
            mix_ratio=args.mix_ratio,
            seed=0,
            max_new_tokens=args.max_new_tokens,
            eos_ids=self.eos,
            pad_id=self.tok.pad_token_id if self.tok.pad_token_id is not None else self.eos[0],
            cache_features=cache_features,
        )


def load_bench_inputs(args: argparse.Namespace) -> BenchInputs:
    """The models, prompts, S and EOS ids from a labelling benchmark's
    flags (--target/--draft, default the demo pair; --prompts or --prompt-set; --num-prompts; S;
    --max-new-tokens; --device/--dtype/--threads). Shared by this benchmark and `bench_responses`."""
    if args.threads:
        torch.set_num_threads(args.threads)
    from acchead.demo_pair import DRAFT_DIR, TARGET_DIR

    target_path, draft_path = args.target or TARGET_DIR, args.draft or DRAFT_DIR
    tok = load_tokenizer(target_path)
    check_tokenizers_match(tok, load_tokenizer(draft_path))
    source = PromptSource("file", args.prompts) if args.prompts else PromptSource("builtin", args.prompt_set)
    prompt_ids = encode_prompts(load_prompts(source, limit=args.num_prompts), tok)
    target = load_causal_lm(target_path, args.dtype, device=args.device)
    draft = load_causal_lm(draft_path, args.dtype, device=args.device)
    context = min(context_length(target, tok), context_length(draft, tok))
    kept = fit_to_context(prompt_ids, args.max_new_tokens, context)
    if not kept:
        raise AccheadError("no prompt fits the context with --max-new-tokens")
    sampling = SamplingConfig(args.temperature, args.top_k, args.top_p)
    eos = eos_ids(target, tok)
    return BenchInputs(tok, target, draft, target_path, draft_path, prompt_ids, kept, sampling, eos)


@cli_errors
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    b = load_bench_inputs(args)
    tok, target, kept, sampling, eos = b.tok, b.target, b.kept, b.sampling, b.eos
    prompt_ids, target_path, draft_path = b.prompt_ids, b.target_path, b.draft_path
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos[0]
    labelers = {cache: b.labeler(args, cache_features=cache) for cache in (False, True)}
    batches = plan_batches(kept, [len(p) for p in prompt_ids], args.batch_size)
    do_sample = not sampling.greedy
    gen_kwargs = dict(do_sample=do_sample, pad_token_id=pad, eos_token_id=eos)
    if do_sample:
        gen_kwargs |= dict(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)

    times = {name: np.zeros(2) for name in ("label", "label+features", "own loop", "generate")}
    tokens = 0
    # Warm-up (allocator, kernels) on the first batch, not timed.
    warm = batches[0]
    labelers[False].label(warm, [prompt_ids[i] for i in warm])
    for batch in batches:
        prompts = [prompt_ids[i] for i in batch]
        dt, rows = timed(target.device, labelers[False].label, batch, prompts)
        times["label"] += dt
        steps = max(len(r.response_ids) for r in rows)  # the decode steps the labelling loop ran
        tokens += sum(len(r.response_ids) for r in rows)
        ids, mask = left_pad(prompts, pad, target.device)
        with torch.no_grad():
            dt, _ = timed(
                target.device, target.generate, input_ids=ids, attention_mask=mask, max_new_tokens=steps,
                min_new_tokens=steps, **gen_kwargs,
            )  # fmt: skip
        times["generate"] += dt
        u = torch.from_numpy(
            np.stack([stream_uniforms(0, i, "generate", args.max_new_tokens) for i in batch])
        )
        times["own loop"] += timed(
            target.device,
            lambda i=ids, m=mask, u=u: sample_and_label(
                target, i, m, sampling, u, args.max_new_tokens, eos, pad
            )
        )[0]
        times["label+features"] += timed(target.device, labelers[True].label, batch, prompts)[0]

    ratio = times["label"] / times["generate"]  # (wall, CPU)
    print(
        f"pair: target {target_path}, draft {draft_path}; device {args.device}, dtype {args.dtype}, "
        f"threads {torch.get_num_threads()}; S: {sampling}"
    )
    print(
        f"{len(kept)} prompts in {len(batches)} batches of <= {args.batch_size}, {tokens} response tokens "
        f"(max {args.max_new_tokens} per prompt)"
    )
    print(f"  {'':15s} {'wall s':>8s} {'tok/s':>8s} {'ratio':>6s}   {'CPU s':>8s} {'ratio':>6s}")
    for name, t in times.items():
        r = t / times["generate"]
        print(f"  {name:15s} {t[0]:8.2f} {tokens / t[0]:8.0f} {r[0]:5.2f}x   {t[1]:8.2f} {r[1]:5.2f}x")
    print(f"labelling overhead: {ratio[0]:.2f}x wall-clock, {ratio[1]:.2f}x CPU time (goal <= 1.5x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
