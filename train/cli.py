"""`acchead-train`: train an acceptance head on a gen-data directory and export `head.safetensors`.

    acchead-train --data DIR --w-rej 6 --depth 3 --out OUT

Settings come from configs/train.yaml, then `--config` (the keys it sets), then flags. Writes
OUT/head.safetensors (through `acchead.save_head`, tied to the draft and the sampling configuration of the
data), OUT/metrics.json, OUT/train_config.yaml (the resolved settings), OUT/checkpoints/ and OUT/logs/.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from acchead.configs import config_path
from acchead.errors import AccheadError, cli_errors
from acchead.layered_config import field_types, resolve_layers
from acchead.pairs import PAIR_NAMES
from acchead.rundir import (
    DirLock,
    atomic_write_text,
    claim,
    clear_dir,
    is_main_launch_process,
    mark_complete,
    refuse_foreign,
    refuse_out_holding,
    remove_stale_tmp,
    start,
)
from acchead.train.data import read_gen_config
from acchead.train.settings import TrainSettings

_FIELDS = {f.name for f in dataclasses.fields(TrainSettings)}
# The YAML types each key takes: its field's, and Lightning's other forms (`devices: 2`, `precision: 32`).
_TYPES = {**field_types(TrainSettings), "devices": (str, int, list), "precision": (str, int)}


def add_training_flags(p: argparse.ArgumentParser, sweep: bool = False) -> None:
    """Flags shared by acchead-train and acchead-sweep (the sweep sets w_rej/depth itself)."""
    p.add_argument(
        "--config", type=Path, help="YAML with defaults for every flag (default: configs/train.yaml)"
    )
    p.add_argument("--data", help="gen-data directory written by acchead-gen-data")
    p.add_argument("--out", help="output directory")
    p.add_argument("--w-acc", type=float, help="BCE weight of the accept term (default 1)")
    if not sweep:
        p.add_argument("--w-rej", type=float, help="BCE weight of the reject term, > 0 (default 3; paper 6)")
        p.add_argument("--depth", type=int, help="residual blocks of the head, >= 0 (default 3)")
    p.add_argument("--width", type=int,
                   help="width of the head's residual blocks, >= 1 (default: the draft's hidden size, the "
                        "paper's; a narrower head costs less per drafted candidate)")
    p.add_argument("--kind", choices=["candidate", "lookahead"],
                   help="candidate: the paper's head, reads the state after a candidate was fed; "
                        "lookahead: judges a candidate from the state that produced it, before it is "
                        "fed (DESIGN §3.1; default lookahead: it trains on any data, a candidate head "
                        "needs data generated with --mix-ratio < 1)")
    p.add_argument("--inputs",
                   help="a lookahead head's inputs joined by +, from state, logq, entropy, token, topk, "
                        "depth (the candidate's place in its round: needs data from gen-data "
                        "--feature-chain N > 1 and cached states); any non-empty set, the state too is "
                        "optional (default: state+token for a lookahead head, state for a candidate head)")
    p.add_argument("--default-h", type=float,
                   help="stop threshold h recorded in the head, used by `specdecpp` without h= "
                        "(default 0.8, measured best for the shipped heads)")
    p.add_argument("--optimizer", choices=["adam", "adamw"], help="optimiser (default adam, the paper's)")
    p.add_argument("--lr", type=float, help="peak learning rate (default 3e-3, measured; paper: 5e-5)")
    p.add_argument("--weight-decay", type=float, help="Adam L2 / AdamW decoupled weight decay (default 0)")
    p.add_argument("--betas", type=float, nargs=2, metavar=("B1", "B2"),
                   help="Adam betas, each in [0, 1) (default 0.9 0.999)")
    p.add_argument(
        "--schedule", choices=["cosine", "constant"], help="learning-rate schedule (default cosine)"
    )
    p.add_argument("--warmup", type=float, help="fraction of steps in linear warm-up (default 0)")
    p.add_argument("--epochs", type=int, help="passes over the training split (default 8; paper 3)")
    p.add_argument("--batch-size", type=int, help="cached features: Y-positions per step (default 1024)")
    p.add_argument("--batch-sequences", type=int, help="on-the-fly: sequences per step (paper: 32)")
    p.add_argument(
        "--features",
        choices=["auto", "cached", "on-the-fly"],
        help="cached features.npy, or run the frozen draft every step (default auto: cached if present)",
    )
    p.add_argument(
        "--draft",
        help="draft model dir for on the fly (default: a named pair's draft if it is the data's); "
        "with a cache it is checked against the cache's draft",
    )
    p.add_argument(
        "--pair",
        choices=PAIR_NAMES,
        help="a named pair whose draft stands for --draft (checked against the data's draft like --draft)",
    )
    p.add_argument("--draft-dtype", help="dtype of the frozen draft on the fly (default float32)")
    p.add_argument(
        "--val-fraction", type=float, help="share of prompts held out for validation (default 0.1)"
    )
    p.add_argument("--seed", type=int, help="seed of split, shuffles and initialisation (default 0)")
    p.add_argument("--accelerator", help="Lightning accelerator: auto, cpu, gpu (default auto)")
    p.add_argument("--devices", help="Lightning devices: auto, a count or ids like 0,1 (default auto)")
    p.add_argument("--strategy", help="Lightning strategy: auto, ddp, ddp_spawn, fsdp, ... (default auto)")
    p.add_argument("--num-nodes", type=int, help="number of nodes (multi-node DDP; default 1)")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice; 1 on a busy box)")
    p.add_argument("--precision", help="Lightning precision: 32-true, bf16-mixed, 16-mixed (default 32-true)")
    p.add_argument("--logger", choices=["csv", "tensorboard", "none"], help="training logs under OUT/logs")
    if sweep:  # a sweep's cells are short: no checkpoints or progress bars (a killed sweep keeps its cells)
        return
    p.add_argument("--no-checkpoints", dest="checkpoints", action="store_false", help="write no checkpoints")
    p.add_argument(
        "--checkpoint-every",
        type=float,
        help="also save OUT/checkpoints/last.ckpt mid-epoch once this many seconds passed (default 60)",
    )
    p.add_argument("--no-progress", dest="progress", action="store_false", help="hide progress bars")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="acchead-train",
        description="Train a SpecDec++ acceptance head (weighted soft-label BCE) on acchead-gen-data output.",
        argument_default=argparse.SUPPRESS,  # unset flags do not override the YAML
    )
    add_training_flags(p)
    p.add_argument("--resume", help="checkpoint to resume, or 'last' for OUT/checkpoints/last.ckpt")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace OUT even if it holds another run (another training run's head and checkpoints, a "
        "bench, gen-data); without it, such an OUT is refused and the same run resumes",
    )
    return p


def resolve_settings(args: argparse.Namespace, fixed: dict[str, Any] | None = None) -> dict[str, Any]:
    """The shipped YAML, then `--config`, then the flags given, then `fixed` (`acchead.layered_config`);
    returns TrainSettings keyword arguments."""
    flags = vars(args)
    user = flags.pop("config", None)
    merged = resolve_layers(config_path("train"), user, {**flags, **(fixed or {})}, _FIELDS, accepted=_TYPES)
    if merged.get("logger") == "none":
        merged["logger"] = None
    if isinstance(merged.get("devices"), str) and merged["devices"].isdigit():
        merged["devices"] = int(merged["devices"])
    if merged.get("betas") is not None:
        merged["betas"] = tuple(merged["betas"])
    for key in ("data", "out"):
        if not merged.get(key):
            raise AccheadError(f"--{key} is required")
    return merged


def write_text(path: Path, text: str) -> None:
    """Atomic, durable write (tmp, fsync, rename): a crash or power loss never leaves a half-written file."""
    atomic_write_text(path, text)


def write_json(path: Path, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def metrics_table(metrics: dict[str, Any]) -> str:
    """Markdown table: head vs the best constant predictor, on validation and train."""
    from acchead.train.metrics import METRIC_NAMES

    lines = [
        "| metric | val head | val best constant | train head | train best constant |",
        "|---|---|---|---|---|",
    ]
    for name in METRIC_NAMES:
        cells = []
        for split in ("val", "train"):
            m = metrics[split]
            const = m["best_constant"].get(name)
            cells += [f"{m[name]:.4f}", "—" if const is None else f"{const:.4f}"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("best constant: the optimal constant prediction under that row's loss, fitted on that split")
    return "\n".join(lines)


# Identity keys that do not change what a run computes: where things are, how it is shown or saved.
_NOT_IDENTITY = ("data", "out", "resume", "progress", "logger", "threads", "checkpoints", "checkpoint_every",
                 "draft", "extra")  # fmt: skip
# Rank 0 tells the DDP worker processes it launches which checkpoint it resumes (they inherit the env).
RESUME_ENV = "ACCHEAD_TRAIN_RESUME"


def run_identity(settings: TrainSettings) -> dict[str, Any]:
    """What a training run's outputs depend on: its settings, with the data named by its content.

    The data directory counts by the sha256 of its gen_config.json (models, S, seed, counts), so moving it
    keeps the run the same; paths, threads, logging and checkpointing cadence are not part of it.
    """
    ident = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(settings).items()}
    ident = {k: v for k, v in ident.items() if k not in _NOT_IDENTITY}
    try:
        gen_config = (Path(settings.data) / "gen_config.json").read_bytes()
    except OSError:
        gen_config = None  # train_head reports the bad --data in one line
    ident["data"] = hashlib.sha256(gen_config).hexdigest()[:16] if gen_config is not None else None
    return ident


def _report_complete(out: Path) -> int:
    with contextlib.suppress(OSError, ValueError, KeyError):
        print(metrics_table(json.loads((out / "metrics.json").read_text())))
    print(f"{out} already holds this run, complete (--overwrite retrains it)", file=sys.stderr)
    return 0


@cli_errors
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    overwrite = bool(vars(args).pop("overwrite", False))
    settings = TrainSettings(**resolve_settings(args))
    read_gen_config(settings.data)  # a bad --data fails first, before torch and lightning load (seconds)
    settings.check()
    from acchead.train.fit import (  # deferred, after the flags: torch and lightning take seconds
        LAST_CKPT,
        quiet_lightning,
        train_head,
    )

    quiet_lightning()
    out = Path(settings.out)  # type: ignore[arg-type]
    if not is_main_launch_process():  # a DDP worker: rank 0 holds OUT and writes the outputs
        settings.resume = os.environ.get(RESUME_ENV) or settings.resume
        train_head(settings)
        return 0
    identity = run_identity(settings)
    last = out / "checkpoints" / LAST_CKPT
    refuse_out_holding(out, data=settings.data, draft=settings.draft, resume=settings.resume)
    refuse_foreign(out, "train", overwrite=overwrite)  # before the lock file goes into it
    with DirLock(out, "acchead-train"):
        status = claim(out, "train", identity, overwrite=overwrite)
        for d in (out, out / "checkpoints"):
            remove_stale_tmp(d)
        if status == "complete":
            return _report_complete(out)
        if status == "resume" and settings.resume is None and last.is_file():
            settings.resume = "last"  # the same run, killed: continue it (same as --resume last)
            print(f"resuming {out} from {last} (same settings)", file=sys.stderr)
        if status == "new":
            start(out, "train", identity)
        os.environ[RESUME_ENV] = str(last) if settings.resume == "last" else settings.resume or ""
        try:
            result = train_head(settings)
        except AccheadError:
            if status == "new" and not last.exists():
                clear_dir(out)  # nothing was trained: a corrected rerun starts from an empty OUT
            raise
        finally:
            os.environ.pop(RESUME_ENV, None)
        _write_outputs(settings, out, result)
        mark_complete(out, "train", identity)
    return 0


def _write_outputs(settings: TrainSettings, out: Path, result: Any) -> None:
    from acchead.head_io import save_head

    out.mkdir(parents=True, exist_ok=True)
    head_path = save_head(result.module.head.cpu().float(), out / "head.safetensors", meta=result.meta)
    write_json(out / "metrics.json", result.metrics)
    resolved = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(settings).items()}
    write_text(out / "train_config.yaml", yaml.safe_dump(resolved, sort_keys=False))
    m = result.metrics
    print(metrics_table(m))
    print(
        f"{m['val']['positions']} val / {m['train']['positions']} train positions, {m['features']} features, "
        f"{m['epochs']} epochs in {m['fit_seconds']:.1f} s"
    )
    print(f"wrote {head_path} and {out / 'metrics.json'}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
