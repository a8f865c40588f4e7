"""Benchmark (not a test): labelled positions per second, online vs from given responses.

    python -m acchead.data_gen.bench_responses [--num-prompts 64 --max-new-tokens 128 --batch-size 16 ...]

Online (`Labeler.label`), the target samples each response inside gen-data's loop, one forward of each
model per token; from responses (`Labeler.label_responses`, `acchead-gen-data --responses`), a serving
engine has sampled them and both models run once, teacher-forced, over prompt + response. Both label the
same prompts with the same batch size, each batched as `acchead-gen-data` batches it (online by prompt
length, from responses by prompt + response length); the responses are the online run's own, so the two
also check each other (the largest label difference and the number of differing draft tokens are
printed; expected ~1e-7 and 0). The engine's generation time is not counted: it is the engine's work.

Wall time swings with other jobs on a shared CPU; the process's CPU time (one thread: `--threads 1`) does
not, so both rates are printed.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

from acchead.data_gen.bench_overhead import add_input_flags, load_bench_inputs, timed
from acchead.data_gen.shards import plan_batches
from acchead.errors import DefaultsHelpFormatter, cli_errors


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m acchead.data_gen.bench_responses",
        description="Labelled positions per second of gen-data online (the target samples) and from given "
        "responses (teacher-forced), same prompts and batches; prints the ratio (goal >= 5x on the CPU).",
        formatter_class=DefaultsHelpFormatter,
    )
    add_input_flags(p, num_prompts=64, mix_ratio=1.0, mix_help="r (gen-data's default for lookahead heads)")
    a = p.add_argument
    a(
        "--cache-features",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="also time the draft's feature pass over prompt + Z (the same work in both modes)",
    )
    return p


@cli_errors
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    b = load_bench_inputs(args)
    kept, sampling, prompt_ids = b.kept, b.sampling, b.prompt_ids
    target_path, draft_path = b.target_path, b.draft_path
    labeler = b.labeler(args, cache_features=args.cache_features)
    device = b.target.device  # the timer waits on it
    batches = plan_batches(kept, [len(p) for p in prompt_ids], args.batch_size)

    # Warm-up (allocator, kernels) on the first batch, not timed.
    warm = [prompt_ids[i] for i in batches[0]]
    rows = labeler.label(batches[0], warm)
    labeler.label_responses(batches[0], warm, [r.response_ids.tolist() for r in rows])

    times = {"online": np.zeros(2), "responses": np.zeros(2)}
    online = {}
    for batch in batches:
        dt, rows = timed(device, labeler.label, batch, [prompt_ids[i] for i in batch])
        times["online"] += dt
        online |= {r.prompt_index: r for r in rows}
    responses = {i: r.response_ids.tolist() for i, r in online.items()}
    positions = sum(len(r) for r in responses.values())
    total = {i: len(prompt_ids[i]) + len(responses[i]) for i in kept}
    max_diff, y_diff = 0.0, 0
    for batch in plan_batches(kept, total, args.batch_size):
        prompts, resp = [prompt_ids[i] for i in batch], [responses[i] for i in batch]
        dt, rows = timed(device, labeler.label_responses, batch, prompts, resp)
        times["responses"] += dt
        for b in rows:
            a = online[b.prompt_index]
            max_diff = max(max_diff, float(np.abs(a.accept_prob - b.accept_prob).max()))
            y_diff += int((a.draft_ids != b.draft_ids).sum())

    print(
        f"pair: target {target_path}, draft {draft_path}; device {args.device}, dtype {args.dtype}, "
        f"threads {torch.get_num_threads()}; S: {sampling}; features {'on' if args.cache_features else 'off'}"
    )
    print(
        f"{len(kept)} prompts in {len(batches)} batches of <= {args.batch_size}, {positions} labelled "
        f"positions (max {args.max_new_tokens} per prompt)"
    )
    print(f"  {'':10s} {'wall s':>8s} {'pos/s':>8s}   {'CPU s':>8s} {'pos/s':>8s}")
    for name, t in times.items():
        print(f"  {name:10s} {t[0]:8.2f} {positions / t[0]:8.0f}   {t[1]:8.2f} {positions / t[1]:8.0f}")
    ratio = times["online"] / times["responses"]
    print(
        f"from responses / online: {ratio[0]:.2f}x wall-clock, {ratio[1]:.2f}x CPU time (goal >= 5x); "
        f"labels differ by at most {max_diff:.2e}, draft tokens in {y_diff} positions"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
