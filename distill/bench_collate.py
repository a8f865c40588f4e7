"""Benchmark (not a test): a feature draft's training batch, collated in the features' float16 and converted
on the device (what training does), against collating it in float32 on the host (before the twenty-fourth
session), same examples, one run.

    python -m acchead.distill.bench_collate [--batch 64] [--pairs 500] [--width 2304] [--device cuda]

A batch is `--batch` examples of `--pairs` pairs of states `--width` wide (the real pair's fused draft: 4 ×
576). Each way is timed from the examples to the float32 tensors the loss reads on `--device` (collate,
copy, convert), the fastest of `--repeats` (the host's way timed before and after the other); prints both
and their ratio. On a GPU the copy is what the ratio is about (half the bytes).
"""

from __future__ import annotations

import argparse
import sys
import time

from acchead.errors import AccheadError, cli_errors


def _batch_seconds(examples: list, device: str, hidden: int, on_host: bool, repeats: int) -> float:
    """Fastest of `repeats`: examples -> the float32 states `feature_loss` uses on `device`: (B, T, W) read
    and the regressed final states (B, T, H). `on_host`: collated in float32 (the conversion on the host,
    all W columns of both); else in the examples' float16, converted on `device` as the loss does."""
    import torch

    from acchead.distill.feature_training import collate_features
    from acchead.step_cost import device_sync

    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        _, _, _, read, target = collate_features(examples, 0, torch.float32 if on_host else None)
        read, final = read.to(device).float(), target.to(device)[..., :hidden].float()
        device_sync(device)
        best = min(best, time.perf_counter() - start)
        del read, final
    return best


@cli_errors
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m acchead.distill.bench_collate", description=__doc__.split("\n")[0]
    )
    p.add_argument("--batch", type=int, default=64, help="examples per batch (default 64, a GPU run's)")
    p.add_argument("--pairs", type=int, default=500, help="pairs per example (default 500)")
    p.add_argument("--width", type=int, default=2304, help="state width W (default 2304: 4 x 576)")
    p.add_argument("--hidden", type=int, default=576, help="H, the final state's width (default 576)")
    p.add_argument("--device", default="cpu", help="where the batch goes: cpu (default) or cuda[:N]")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats of each way; the fastest counts (3)")
    args = p.parse_args(argv)
    if min(args.batch, args.pairs, args.width, args.hidden, args.repeats) < 1:
        raise AccheadError("--batch, --pairs, --width, --hidden and --repeats must be >= 1")
    if args.width % args.hidden:
        raise AccheadError(f"--width {args.width} must be a multiple of --hidden {args.hidden}")
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise AccheadError(f"--device {args.device}: no CUDA device here")
    g = torch.Generator().manual_seed(0)
    examples = [
        (torch.zeros(args.pairs, dtype=torch.long), torch.zeros(args.pairs, dtype=torch.long),
         torch.randn(args.pairs + 1, args.width, generator=g).half())
        for _ in range(args.batch)
    ]  # fmt: skip
    host = _batch_seconds(examples, args.device, args.hidden, on_host=True, repeats=args.repeats)
    kept = _batch_seconds(examples, args.device, args.hidden, on_host=False, repeats=args.repeats)
    host = min(host, _batch_seconds(examples, args.device, args.hidden, on_host=True, repeats=args.repeats))
    print(f"a batch of {args.batch} x {args.pairs} pairs, {args.width} wide, to float32 on {args.device}:")
    print(f"  float32 collated on the host:       {1000 * host:8.1f} ms")
    print(f"  float16 collated, converted there:  {1000 * kept:8.1f} ms")
    print(f"  ratio host / kept: {host / kept:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
