"""Benchmark (not a test): one training epoch on cached features vs on the fly, same data, one run.

    python -m acchead.train.bench_features --data DIR [--draft DRAFT_DIR]

Both runs train the same head on the same training split for one epoch with validation off; each mode
uses its own batch semantics (cached: `--batch-size` positions, on the fly: `--batch-sequences` rows, the
draft's forward inside every step). Prints both times, positions/s and the speed-up ratio.
"""

from __future__ import annotations

import argparse
import sys
import time

from acchead.errors import cli_errors


def _epoch_seconds(data, args: argparse.Namespace, draft) -> tuple[float, float]:
    """(wall, CPU) seconds of one training epoch; CPU time is the honest figure on a shared machine."""
    import lightning as L

    from acchead.train.datamodule import GenDataModule
    from acchead.train.module import AcceptanceHeadModule

    L.seed_everything(args.seed, verbose=False)
    dm = GenDataModule(data, args.val_fraction, args.seed, args.batch_size, args.batch_sequences)
    module = AcceptanceHeadModule(data.hidden_size, args.depth, w_rej=args.w_rej, lr=args.lr, draft=draft)
    trainer = L.Trainer(
        max_epochs=1,
        accelerator=args.accelerator,
        devices=1,
        precision=args.precision,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
    )
    start, cpu = time.perf_counter(), time.process_time()
    trainer.fit(module, datamodule=dm)
    return time.perf_counter() - start, time.process_time() - cpu


@cli_errors
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m acchead.train.bench_features", description=__doc__.splitlines()[0]
    )
    p.add_argument("--data", required=True, help="gen-data directory WITH a feature cache")
    p.add_argument("--draft", help="draft model directory for the on-the-fly run (default: the demo draft)")
    p.add_argument("--depth", type=int, default=3, help="head depth (default 3)")
    p.add_argument("--w-rej", type=float, default=6.0, help="reject weight (default 6)")
    p.add_argument("--lr", type=float, default=3e-3, help="learning rate (default 3e-3)")
    p.add_argument(
        "--batch-size",
        type=int,
        help="cached: positions per step (default: the mean positions of --batch-sequences rows, so both "
        "runs take the same number of optimiser steps)",
    )
    p.add_argument("--batch-sequences", type=int, default=32, help="on the fly: rows per step (default 32)")
    p.add_argument("--val-fraction", type=float, default=0.1, help="held-out prompts (not trained on)")
    p.add_argument("--accelerator", default="auto", help="Lightning accelerator (default auto)")
    p.add_argument("--precision", default="32-true", help="Lightning precision (default 32-true)")
    p.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    args = p.parse_args(argv)

    from acchead.train.data import check_draft, load_gen_data, split_by_prompt
    from acchead.train.draft import FrozenDraft
    from acchead.train.fit import quiet_lightning

    quiet_lightning()

    cached = load_gen_data(args.data, "cached")
    fly = load_gen_data(args.data, "on-the-fly")
    if args.draft is None:
        from acchead.demo_pair import DRAFT_DIR

        args.draft = str(DRAFT_DIR)
    draft = FrozenDraft.load(args.draft)
    check_draft(fly.draft, draft.identity, "--draft")
    if args.batch_size is None:
        args.batch_size = max(1, round(args.batch_sequences * len(cached.labels) / cached.num_rows))
    (t_cached, c_cached), (t_fly, c_fly) = (
        _epoch_seconds(cached, args, None),
        _epoch_seconds(fly, args, draft),
    )
    val = split_by_prompt(cached.prompt_index, args.val_fraction, args.seed)
    n = int((~val[cached.row]).sum())
    rows = int((~val).sum())
    print(f"one epoch over {n} training Y-positions ({rows} rows), hidden size {cached.hidden_size}:")
    print(f"  batches: cached {args.batch_size} positions, on the fly {args.batch_sequences} rows")
    print(
        f"  cached features: {t_cached:8.2f} s wall, {c_cached:8.2f} s CPU ({n / t_cached:,.0f} positions/s)"
    )
    print(f"  on the fly:      {t_fly:8.2f} s wall, {c_fly:8.2f} s CPU ({n / t_fly:,.0f} positions/s)")
    print(f"  ratio on-the-fly / cached: {t_fly / t_cached:.1f}x wall, {c_fly / c_cached:.1f}x CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
