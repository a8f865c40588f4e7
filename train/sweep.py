"""`acchead-sweep`: the paper's Table 3 grid, w_rej ∈ {1, 3, 6, 12} × depth ∈ {0, …, 4}, in one process.

    acchead-sweep --data DIR --out OUT

The gen-data directory is loaded once and the 20 heads are trained one after another on it (with cached
features each is a few seconds of small-MLP training on CPU). Writes OUT/sweep.md (train / eval KL per
cell, the Table 3 layout, with the wall time), OUT/sweep.json (every metric per cell) and each head under
OUT/heads/wrej{W}_depth{D}/head.safetensors. Training flags are those of acchead-train.

OUT is locked and claimed like every stage's (`acchead.rundir`, kind "sweep"): a killed sweep rerun with
the same flags keeps the cells it finished (each cell's `cell.json` is written last) and trains the rest;
other flags are refused unless `--overwrite`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from acchead.errors import AccheadError, cli_errors
from acchead.rundir import is_main_launch_process, locked_run, mark_complete, refuse_out_holding
from acchead.train.cli import add_training_flags, resolve_settings, run_identity, write_json, write_text
from acchead.train.data import read_gen_config
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
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace OUT even if it holds another run; without it, such an OUT is refused and the same "
        "sweep resumes (finished cells are kept)",
    )
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


def _run_cells(
    settings0: TrainSettings, out: Path, w_rejs: list[float], depths: list[int]
) -> tuple[list[dict[str, Any]], float, str]:
    """Train every (w_rej, depth) cell not finished yet.

    Returns (every cell's record, seconds spent loading the data, the feature mode: cached / on the fly).

    A cell is finished once OUT/heads/<cell>/cell.json exists: it is written after the head and metrics.
    """
    from acchead.head_io import save_head  # deferred: torch/lightning make `--help` slow
    from acchead.train.data import load_gen_data
    from acchead.train.fit import train_head

    t0 = time.perf_counter()
    data, load_s = None, 0.0  # loaded once, on the first cell that needs training
    cells = []
    for w in w_rejs:
        for d in depths:
            cell_dir = out / "heads" / f"wrej{w:g}_depth{d}"
            record = cell_dir / "cell.json"
            if record.is_file():
                cells.append(json.loads(record.read_text()))
                continue
            if data is None:
                data = load_gen_data(settings0.data, settings0.features, settings0.kind)  # type: ignore[arg-type]
                load_s = time.perf_counter() - t0
            t_cell = time.perf_counter()
            settings = TrainSettings(**{**settings0.__dict__, "w_rej": w, "depth": d, "out": str(cell_dir)})
            result = train_head(settings, data=data)
            if not result.is_global_zero:
                continue
            cell_dir.mkdir(parents=True, exist_ok=True)
            save_head(result.module.head.cpu().float(), cell_dir / "head.safetensors", meta=result.meta)
            write_json(cell_dir / "metrics.json", result.metrics)
            m = result.metrics
            cell = {
                "w_rej": w,
                "depth": d,
                "train_kl": m["train"]["kl"],
                "eval_kl": m["val"]["kl"],
                "eval": {k: v for k, v in m["val"].items() if k != "best_constant"},
                "eval_best_constant": m["val"]["best_constant"],
                "seconds": time.perf_counter() - t_cell,
            }
            write_json(record, cell)  # last: the cell is finished
            cells.append(cell)
            print(
                f"w_rej={w:g} depth={d}: train KL {cell['train_kl']:.4f}, eval KL {cell['eval_kl']:.4f} "
                f"({cell['seconds']:.1f} s)",
                file=sys.stderr,
            )
    # No data loaded: every cell was finished by an earlier, killed run.
    return cells, load_s, data.mode if data is not None else str(settings0.features)


@cli_errors
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    overwrite = bool(vars(args).pop("overwrite", False))
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
    read_gen_config(settings0.data)  # a bad --data fails here, before torch and lightning load (seconds)
    settings0.check()  # bad flags fail before OUT is claimed, so the corrected rerun is the same sweep
    refuse_out_holding(settings0.out, data=settings0.data, draft=settings0.draft)  # type: ignore[arg-type]
    from acchead.train.fit import quiet_lightning  # deferred, after the flags: torch/lightning take seconds

    quiet_lightning()
    out = Path(settings0.out)  # type: ignore[arg-type]
    identity = {**run_identity(settings0), "grid_w_rej": w_rejs, "grid_depth": depths}
    if not is_main_launch_process():  # a DDP worker: rank 0 holds OUT and writes the outputs
        _run_cells(settings0, out, w_rejs, depths)
        return 0
    with locked_run(out, "sweep", identity, prog="acchead-sweep", overwrite=overwrite) as status:
        if status == "complete":
            print((out / "sweep.md").read_text())
            print(f"{out} already holds this sweep, complete (--overwrite reruns it)", file=sys.stderr)
            return 0
        start = time.perf_counter()
        cells, load_s, mode = _run_cells(settings0, out, w_rejs, depths)
        wall = time.perf_counter() - start
        table = sweep_table(cells, w_rejs, depths, wall)
        write_text(out / "sweep.md", table)
        kept = {k: v for k, v in settings0.__dict__.items() if k not in ("data", "out", "extra")}
        write_json(
            out / "sweep.json",
            {
                "wall_seconds": wall,
                "load_seconds": load_s,
                "data": str(settings0.data),
                "features": mode,
                "settings": kept,
                "cells": cells,
            },
        )
        mark_complete(out, "sweep", identity)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
