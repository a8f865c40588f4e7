"""One head training run as a function: settings in, trained head + metrics out.

Shared by `acchead-train` (one run, CLI flags) and `acchead-sweep` (20 runs in one process on one loaded
dataset). Only this module builds Trainers.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import signal
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, LearningRateMonitor
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from acchead.errors import AccheadError
from acchead.head_io import HeadMetadata
from acchead.rundir import commit
from acchead.train.data import GenData, check_draft, load_gen_data, same_draft
from acchead.train.datamodule import GenDataModule
from acchead.train.draft import FrozenDraft
from acchead.train.metrics import best_constant
from acchead.train.module import AcceptanceHeadModule
from acchead.train.settings import TrainSettings


@dataclass
class TrainResult:
    """A finished run: the module (its `.head` is the trained AcceptanceHead), metrics, and metadata."""

    module: AcceptanceHeadModule
    metrics: dict[str, Any]
    meta: HeadMetadata
    trainer: L.Trainer

    @property
    def is_global_zero(self) -> bool:
        return self.trainer.is_global_zero


def quiet_lightning() -> None:
    """Keep CLI output to what matters: Lightning's banner lines and two harmless warnings go.

    The warnings: a torch-internal pytree deprecation raised inside Lightning, and "fewer batches than the
    logging interval" (cached-feature epochs are often a handful of large batches).
    """
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")
    warnings.filterwarnings("ignore", message=r".*smaller than the logging interval.*")


def resolve_draft(settings: TrainSettings, data: GenData) -> FrozenDraft | None:
    """The frozen draft for on-the-fly features (checked against the data), or None with cached ones.

    gen_config.json records the draft's identity, not its path: on the fly the draft is `--draft`, the
    draft of `--pair`, or else the named pairs' draft (`acchead.pairs.shipped_drafts`) that is the data's.
    With cached features a given `--draft` / `--pair` is only checked: a cache of another draft is refused.
    """
    from acchead.pairs import pair_draft, shipped_drafts

    given = settings.draft or (pair_draft(settings.pair) if settings.pair else None)
    flag = "--draft" if settings.draft else f"--pair {settings.pair}"
    if data.mode == "cached":
        if given:
            cache_draft = data.config["features"].get("draft", data.draft)
            check_draft(cache_draft, FrozenDraft.load(given).identity, flag)
        return None
    if given:
        draft = FrozenDraft.load(given, dtype=settings.draft_dtype)
        check_draft(data.draft, draft.identity, flag)
        return draft
    for path in shipped_drafts():  # the named pairs' drafts: the data records which one it was made with
        shape = json.loads((path / "config.json").read_text())
        if shape.get("hidden_size") != data.draft.get("hidden_size"):
            continue  # not it, and loading it could need its target's assets (the SmolLM2 draft does)
        draft = FrozenDraft.load(path, dtype=settings.draft_dtype)
        if same_draft(draft.identity, data.draft):
            return draft
    raise AccheadError(
        f"on-the-fly features need the draft {data.draft.get('name')!r} the data was generated with: "
        "pass --draft PATH"
    )


def _resume_path(settings: TrainSettings) -> str | None:
    if not settings.resume:
        return None
    path = Path(settings.resume)
    if settings.resume == "last":
        if settings.out is None:
            raise AccheadError("--resume last needs --out (it resumes OUT/checkpoints/last.ckpt)")
        path = Path(settings.out) / "checkpoints" / "last.ckpt"
    if not path.is_file():
        raise AccheadError(f"checkpoint to resume does not exist: {path}")
    return str(path)


def _check_resume(ckpt: str, module: AcceptanceHeadModule) -> None:
    """A checkpoint of another head shape is refused before Lightning fails deep inside load_state_dict."""
    try:
        hp = torch.load(ckpt, map_location="cpu", weights_only=False).get("hyper_parameters", {})
    except Exception as e:  # truncated file, not a pickle, not a dict: torch raises many types
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise AccheadError(
            f"checkpoint {ckpt} is unreadable ({msg}); resume from another one, or rerun with --overwrite"
        ) from None
    for key in ("hidden_size", "depth", "width", "kind", "inputs"):
        mine, theirs = module.hparams[key], hp.get(key, {"kind": "candidate", "inputs": ("state",)}.get(key))
        if key == "width":  # None is the hidden size (and checkpoints from before widths carry none)
            mine, theirs = mine or module.hparams["hidden_size"], theirs or hp.get("hidden_size")
        if key == "inputs":
            mine, theirs = tuple(mine), tuple(theirs or ())
        if theirs != mine:
            what = "head/draft hidden-size mismatch" if key == "hidden_size" else f"{key} mismatch"
            raise AccheadError(f"{what}: checkpoint {ckpt} has {key}={theirs}, this run {mine}")


def _logger(settings: TrainSettings):
    if settings.logger is None or settings.out is None:
        return False
    if settings.logger == "tensorboard":
        try:
            from lightning.pytorch.loggers import TensorBoardLogger

            return TensorBoardLogger(settings.out, name="logs")
        except ModuleNotFoundError:
            raise AccheadError("--logger tensorboard needs `pip install tensorboard`") from None
    from lightning.pytorch.loggers import CSVLogger

    return CSVLogger(settings.out, name="logs")


LAST_CKPT = "last.ckpt"


class RunCheckpoint(Callback):
    """Keeps `dirpath/last.ckpt` at most about `every_s` seconds of training old, written atomically.

    It is saved at every epoch end and, inside an epoch, after the first training batch that ends `every_s`
    seconds after the previous save (the decision is rank 0's, broadcast, so every DDP rank saves
    together). The checkpoint is written beside, fsynced and renamed over last.ckpt: a kill at any moment
    leaves the previous complete one. The training loader is resumable
    (`acchead.train.datamodule.IndexBatches` records the batches it has served), so a run resumed from a
    mid-epoch checkpoint skips exactly the batches already trained on and ends with the head of an
    uninterrupted run. This replaces Lightning's ModelCheckpoint, which writes in place and names a second
    run's file last-v1.ckpt.
    """

    def __init__(self, dirpath: str | Path, every_s: float = 60.0) -> None:
        self.dirpath, self.every_s = Path(dirpath), every_s
        self._last = time.monotonic()
        self._trainer: L.Trainer | None = None
        self._loader_state: dict | None = None

    @property
    def path(self) -> Path:
        return self.dirpath / LAST_CKPT

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._trainer = trainer

    def state_dict(self) -> dict[str, Any]:
        """The training loader's position in its epoch, saved with every checkpoint."""
        sampler = getattr(self._trainer.train_dataloader, "sampler", None) if self._trainer else None
        return {"loader": sampler.state_dict()} if hasattr(sampler, "state_dict") else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._loader_state = state_dict.get("loader")

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Applied here, not by Lightning's own loader-state restore: that one is skipped when the loader
        # was built early (the cosine schedule asks for `estimated_stepping_batches` before the restore).
        sampler = getattr(trainer.train_dataloader, "sampler", None)
        if self._loader_state is not None and hasattr(sampler, "load_state_dict"):
            sampler.load_state_dict(self._loader_state)
        self._loader_state = None
        self._last = time.monotonic()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        due = time.monotonic() - self._last >= self.every_s
        if trainer.world_size > 1:
            due = trainer.strategy.broadcast(due, src=0)
        if due:
            self.save(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.save(trainer)

    def save(self, trainer: L.Trainer) -> None:
        tmp = self.dirpath / f".{LAST_CKPT}.tmp"
        if trainer.is_global_zero:
            self.dirpath.mkdir(parents=True, exist_ok=True)
        trainer.save_checkpoint(tmp, weights_only=False)  # every rank calls it (a collective when sharded)
        if trainer.is_global_zero:
            commit(tmp, self.path)
        self._last = time.monotonic()


class _InterruptWatch(Callback):
    """Notes a Ctrl-C: Lightning catches KeyboardInterrupt itself and turns it into `sys.exit(1)`."""

    seen = False

    def on_exception(self, trainer: L.Trainer, module: L.LightningModule, exception: BaseException) -> None:
        if isinstance(exception, KeyboardInterrupt):
            self.seen = True


def _fit(
    trainer: L.Trainer, module: AcceptanceHeadModule, dm: GenDataModule, ckpt: str | None, out: Any
) -> None:
    """`trainer.fit`; a Ctrl-C surfaces as a KeyboardInterrupt saying how to continue (CLI: exit 130)."""
    watch = _InterruptWatch()
    trainer.callbacks.append(watch)
    main_thread = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGINT) if main_thread else None
    try:
        trainer.fit(module, datamodule=dm, ckpt_path=ckpt)
    except SystemExit:
        if not watch.seen:
            raise
    finally:
        if main_thread:
            signal.signal(signal.SIGINT, handler)  # Lightning ignores further Ctrl-C after the first
    if watch.seen:
        last = Path(out) / "checkpoints" / LAST_CKPT if out is not None else None
        if last is not None and last.is_file():
            raise KeyboardInterrupt(f"{last} is kept; rerun with --resume last (or as before) to continue")
        raise KeyboardInterrupt("no checkpoint was written yet")


def train_head(
    settings: TrainSettings,
    data: GenData | None = None,
    callbacks: list[Callback] | None = None,
) -> TrainResult:
    """Train one head, evaluate it on both splits, and describe it.

    Args:
        settings: the run's configuration.
        data: an already loaded gen-data directory (the sweep loads it once); loaded from `settings.data`
            otherwise.
        callbacks: extra Lightning callbacks (tests use one to interrupt a run).
    """
    settings.check()
    if settings.threads:
        # Small-MLP steps gain nothing from many threads, and on a busy machine OpenMP threads that
        # wait on each other make a step 10x slower (measured): let the user pin the count.
        torch.set_num_threads(settings.threads)
    if data is None:
        data = load_gen_data(settings.data, settings.features, settings.kind)  # type: ignore[arg-type]
    elif data.kind != settings.kind:
        raise AccheadError(f"the data was loaded for {data.kind} heads; this run trains {settings.kind}")
    if "depth" in settings.input_names:
        if int(data.config.get("feature_chain", 1)) <= 1:
            raise AccheadError(
                "--inputs with depth needs labels of later candidates: gen-data --feature-chain N > 1 "
                "with a feature draft (this data labels first candidates only)"
            )
        if data.mode != "cached":
            raise AccheadError("--inputs with depth trains on cached states: drop --features on-the-fly")
    draft = resolve_draft(settings, data)
    ckpt = _resume_path(settings)
    L.seed_everything(settings.seed, verbose=False)
    inputs = settings.input_names
    dm = GenDataModule(
        data,
        settings.val_fraction,
        settings.seed,
        settings.batch_size,
        settings.batch_sequences,
        inputs=inputs,
    )
    module = AcceptanceHeadModule(
        hidden_size=data.hidden_size,
        depth=settings.depth,
        w_acc=settings.w_acc,
        w_rej=settings.w_rej,
        lr=settings.lr,
        weight_decay=settings.weight_decay,
        betas=tuple(settings.betas),
        optimizer=settings.optimizer,  # type: ignore[arg-type]
        schedule=settings.schedule,  # type: ignore[arg-type]
        warmup=settings.warmup,
        ece_bins=settings.ece_bins,
        draft=draft,
        kind=settings.kind,
        inputs=inputs,
        sampling=dict(data.sampling),
        width=settings.width,
    )
    if ckpt:
        _check_resume(ckpt, module)
    cbs = list(callbacks or [])
    logger = _logger(settings)
    if logger:
        cbs.append(LearningRateMonitor(logging_interval="step"))
    if settings.checkpoints and settings.out is not None:
        cbs.append(RunCheckpoint(Path(settings.out) / "checkpoints", settings.checkpoint_every))
    try:
        trainer = L.Trainer(
            max_epochs=settings.epochs,
            accelerator=settings.accelerator,
            devices=settings.devices,
            strategy=settings.strategy,
            num_nodes=settings.num_nodes,
            precision=settings.precision,  # type: ignore[arg-type]
            logger=logger,
            callbacks=cbs,
            enable_checkpointing=False,  # RunCheckpoint instead of Lightning's ModelCheckpoint
            default_root_dir=settings.out,
            enable_progress_bar=settings.progress,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            # Our samplers shard by rank themselves (see acchead.train.datamodule.IndexBatches).
            use_distributed_sampler=False,
            log_every_n_steps=10,
        )
    except (ValueError, TypeError, MisconfigurationException) as e:  # Lightning's own checks of these flags
        raise AccheadError(
            f"--accelerator {settings.accelerator} --devices {settings.devices} --strategy "
            f"{settings.strategy} --num-nodes {settings.num_nodes} --precision {settings.precision}: "
            f"{str(e).splitlines()[0]}"
        ) from None
    start = time.perf_counter()
    _fit(trainer, module, dm, ckpt, settings.out)
    fit_s = time.perf_counter() - start
    # Final evaluation of both splits with the trained head, synchronised across processes.
    module.eval_splits = ["val", "train"]
    trainer.validate(module, dataloaders=dm.eval_dataloaders(), verbose=False)
    module.eval_splits = ["val"]
    metrics = _metrics(settings, dm, module, fit_s)
    return TrainResult(
        module=module, metrics=metrics, meta=_metadata(settings, data, dm, metrics), trainer=trainer
    )


def _metrics(settings: TrainSettings, dm: GenDataModule, module: AcceptanceHeadModule, fit_s: float) -> dict:
    splits = {}
    for split in ("val", "train"):
        const = best_constant(torch.from_numpy(dm.split_labels[split]), settings.w_acc, settings.w_rej)
        labels = dm.split_labels[split]
        splits[split] = {
            **module.results[split],
            "positions": len(labels),
            "mean_label": float(labels.mean()),
            "best_constant": const,
        }
    return {
        **splits,
        "fit_seconds": fit_s,
        "head": {
            "depth": settings.depth,
            "width": module.head.width,
            "w_acc": settings.w_acc,
            "w_rej": settings.w_rej,
            "kind": settings.kind,
            "inputs": list(settings.input_names),
        },
        "features": dm.data.mode,
        "epochs": settings.epochs,
        "global_step": module.trainer.global_step,
        "split": dm.summary(),
    }


def _metadata(settings: TrainSettings, data: GenData, dm: GenDataModule, metrics: dict) -> HeadMetadata:
    cfg = data.config
    skip = ("draft", "sampling", "features", "lookahead_features")
    data_meta = {k: v for k, v in cfg.items() if k not in skip}
    data_meta.update(path=str(data.path), features=data.mode, **dm.summary())
    train_meta = {k: v for k, v in dataclasses.asdict(settings).items() if k not in ("data", "out", "extra")}
    return HeadMetadata(
        depth=settings.depth,
        hidden_size=data.hidden_size,
        w_acc=settings.w_acc,
        w_rej=settings.w_rej,
        draft=dict(data.draft),
        sampling=dict(cfg["sampling"]),
        data=data_meta,
        kind=settings.kind,
        inputs=list(settings.input_names),
        default_h=settings.default_h,
        width=settings.width,
        extra={
            "training": train_meta,
            "val_kl": metrics["val"]["kl"],
            "val_weighted_bce": metrics["val"]["weighted_bce"],
            **settings.extra,
        },
    )
