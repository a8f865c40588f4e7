"""Benchmark (not a test): the target's teacher-forced forward (what `acchead-distill features` runs) in
float32 against bfloat16 autocast on this machine, one run; says which `--dtype auto` picks here.

    python -m acchead.distill.bench_autocast [--target DIR_OR_GGUF] [--batch 16] [--length 192] [--threads 2]

Each way runs `--batch` random sequences of `--length` tokens through `shard_features` (the stage's own
forward, the fused layers of `--fused-layers` too), the two interleaved `--repeats` times, the fastest of
each counting; prints positions/s of both and their ratio. bfloat16 autocast pays where the hardware
computes in it (AMX, AVX-512 BF16, a GPU: `acchead.models.native_bfloat16`) and is emulated elsewhere.
"""

from __future__ import annotations

import argparse
import sys
import time

from acchead.errors import AccheadError, cli_errors, thread_count


def _seconds(target, seqs: list[list[int]], bf16: bool, layers: tuple[int, ...]) -> float:
    """One pass of `seqs` through the features stage's forward (batched as the stage batches them)."""
    from acchead.distill.features import shard_features
    from acchead.step_cost import device_sync

    start = time.perf_counter()
    shard_features(target, seqs, batch_tokens=sum(len(s) for s in seqs), bf16=bf16, layers=layers)
    device_sync(str(target.device))
    return time.perf_counter() - start


@cli_errors
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m acchead.distill.bench_autocast", description=__doc__.split("\n")[0]
    )
    p.add_argument("--target", help="a transformers directory or a .gguf file (default: the real pair's)")
    p.add_argument("--batch", type=int, default=16, help="sequences per forward (16)")
    p.add_argument("--length", type=int, default=192, help="tokens per sequence (192)")
    p.add_argument("--fused-layers", default="2,15,27", metavar="I,J,...",
                   help="layers whose outputs are stored too, as the shipped draft reads (2,15,27; '' for "
                   "none)")  # fmt: skip
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    p.add_argument("--threads", type=thread_count, default=None, help="torch CPU threads (torch's choice)")
    p.add_argument("--repeats", type=int, default=3, help="timed passes of each way; the fastest counts (3)")
    args = p.parse_args(argv)
    if min(args.batch, args.length, args.repeats) < 1:
        raise AccheadError("--batch, --length and --repeats must be >= 1")
    import torch

    from acchead.assets import TARGET_DIR_NAME, asset_path
    from acchead.distill.stages import parse_layers
    from acchead.models import check_device, load_causal_lm, native_bfloat16

    check_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    layers = parse_layers(args.fused_layers, "--fused-layers")
    target = load_causal_lm(args.target or asset_path(TARGET_DIR_NAME)).to(args.device)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, target.config.vocab_size, (args.batch, args.length), generator=g)
    seqs = ids.tolist()
    _seconds(target, seqs[:1], False, layers)  # first calls pay one-off costs
    _seconds(target, seqs[:1], True, layers)
    best = {False: float("inf"), True: float("inf")}
    for _ in range(args.repeats):
        for bf16 in (False, True):
            best[bf16] = min(best[bf16], _seconds(target, seqs, bf16, layers))
    positions = args.batch * args.length
    native = native_bfloat16(target.device)
    print(f"{args.batch} x {args.length} positions, fused layers {list(layers)}, {args.device}, "
          f"{torch.get_num_threads()} threads:")  # fmt: skip
    print(f"  float32:            {positions / best[False]:9.1f} positions/s")
    print(f"  bfloat16 autocast:  {positions / best[True]:9.1f} positions/s")
    print(f"  ratio bfloat16 / float32: {best[False] / best[True]:.2f}x "
          f"(--dtype auto picks {'bfloat16' if native else 'float32'} here)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
