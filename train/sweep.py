"""`acchead-sweep`: the paper's Table 3 grid, w_rej ∈ {1, 3, 6, 12} × depth ∈ {0, …, 4}, in one process.

    acchead-sweep --data DIR --out OUT

The gen-data directory is loaded once and the 20 heads are trained one after another on it (with cached
features each is a few seconds of small-MLP training on CPU). Writes OUT/sweep.md (train / eval KL per
cell, the Table 3 layout, with the wall time), OUT/sweep.json (every metric per cell) and each head under
OUT/heads/wrej{W}_depth{D}/head.safetensors. Training flags are those of acchead-train.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from acchead.errors import AccheadError, cli_errors
from acchead.train.cli import add_training_flags, resolve_settings, write_json, write_text
from acchead.train.settings import TrainSettings

W_REJ = (1.0, 3.0, 6.0, 12.0)
DEPTHS = (0, 1, 2, 3, 4)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="acchead-sweep",
        description="Train the paper's grid of heads (w_rej x depth) on one gen-data directory; "
        "write a Table-3-style KL table.",
        argument_default=argparse.SUPPRESS,
    )
    add_training_flags(p, sweep=True)
    p.add_argument(
        "--w-rej", dest="grid_w_rej", type=float, nargs="+", help="w_rej values (default 1 3 6 12)"
    )
    p.add_argument("--depth", dest="grid_depth", type=int, nargs="+", help="depths (default 0 1 2 3 4)")
    return p


def sweep_table(cells: list[dict[str, Any]], w_rejs: list[float], depths: list[int], wall_s: float) -> str:
    """Markdown: one row per w_rej, one column per depth, each cell `train KL / eval KL`."""
    by_key = {(c["w_rej"], c["depth"]): c for c in cells}
    lines = [
        f"Binary KL (train / eval, unweighted; eval = held-out prompts) of {len(cells)} heads, "
        f"trained in {wall_s:.1f} s wall time.",
        "",
        "| w_rej \\ depth | " + " | ".join(f"D={d}" for d in depths) + " |",
        "|---" * (len(depths) + 1) + "|",
    ]
    for w in w_rejs:
        row = [f"{by_key[(w, d)]['train_kl']:.4f} / {by_key[(w, d)]['eval_kl']:.4f}" for d in depths]
        lines.append(f"| {w:g} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


@cli_errors
def main(argv: list[str] | None = None) -> int:
    from acchead.head_io import save_head  # deferred: torch/lightning make `--help` slow
    from acchead.train.data import load_gen_data
    from acchead.train.fit import quiet_lightning, train_head

    args = build_parser().parse_args(argv)
    quiet_lightning()
    w_rejs = [float(w) for w in getattr(args, "grid_w_rej", W_REJ)]
    depths = [int(d) for d in getattr(args, "grid_depth", DEPTHS)]
    for name in ("grid_w_rej", "grid_depth"):
        vars(args).pop(name, None)
    # Sweep cells are short: no checkpoints, logs or progress bars unless given as flags.
    base = {"checkpoints": False, "logger": None, "progress": False}
    kwargs = resolve_settings(args, fixed=None)
    settings0 = TrainSettings(**{**kwargs, **{k: v for k, v in base.items() if k not in vars(args)}})
    for w in w_rejs:
        if w <= 0:
            raise AccheadError(f"--w-rej must be > 0, got {w:g}")
    for d in depths:
        if d < 0:
            raise AccheadError(f"--depth must be >= 0, got {d}")
    out = Path(settings0.out)  # type: ignore[arg-type]
    start = time.perf_counter()
    data = load_gen_data(settings0.data, settings0.features)  # type: ignore[arg-type]
    load_s = time.perf_counter() - start
    cells = []
    for w in w_rejs:
        for d in depths:
            t0 = time.perf_counter()
            cell_dir = out / "heads" / f"wrej{w:g}_depth{d}"
            settings = TrainSettings(**{**settings0.__dict__, "w_rej": w, "depth": d, "out": str(cell_dir)})
            result = train_head(settings, data=data)
            if not result.is_global_zero:
                continue
            cell_dir.mkdir(parents=True, exist_ok=True)
            save_head(result.module.head.cpu().float(), cell_dir / "head.safetensors", meta=result.meta)
            write_json(cell_dir / "metrics.json", result.metrics)
            m = result.metrics
            cells.append(
                {
                    "w_rej": w,
                    "depth": d,
                    "train_kl": m["train"]["kl"],
                    "eval_kl": m["val"]["kl"],
                    "eval": {k: v for k, v in m["val"].items() if k != "best_constant"},
                    "eval_best_constant": m["val"]["best_constant"],
                    "seconds": time.perf_counter() - t0,
                }
            )
            print(
                f"w_rej={w:g} depth={d}: train KL {cells[-1]['train_kl']:.4f}, eval KL "
                f"{cells[-1]['eval_kl']:.4f} ({cells[-1]['seconds']:.1f} s)",
                file=sys.stderr,
            )
    wall = time.perf_counter() - start
    if not cells:
        return 0  # non-zero DDP ranks
    table = sweep_table(cells, w_rejs, depths, wall)
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "sweep.md", table)
    write_json(
        out / "sweep.json",
        {
            "wall_seconds": wall,
            "load_seconds": load_s,
            "data": str(settings0.data),
            "features": data.mode,
            "settings": {k: v for k, v in settings0.__dict__.items() if k not in ("data", "out", "extra")},
            "cells": cells,
        },
    )
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
