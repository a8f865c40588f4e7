"""The LightningModule that trains an `acchead.AcceptanceHead` with the weighted soft-label BCE.

A batch is either cached features (`{"features": (N, H), "labels": (N,), "hard": (N,)}`) or token rows for
the on-the-fly mode (`{"input_ids", "attention_mask", "target_mask", "labels", "hard"}`, all (B, T)); in the
latter the frozen draft turns rows into features inside the step (see `acchead.train.draft`). Either way the
head sees (N, H) features of Y-positions only, so both modes share every line after `_positions`.
"""

from __future__ import annotations

import math
from typing import Literal

import lightning as L
import torch
from torch import nn

from acchead.head import AcceptanceHead
from acchead.lookahead import lookahead_inputs
from acchead.loss import weighted_bce_with_logits
from acchead.models import output_embedding_table
from acchead.sampling import SamplingConfig
from acchead.train.draft import FrozenDraft
from acchead.train.metrics import HeadMetrics


class AcceptanceHeadModule(L.LightningModule):
    """Trains `AcceptanceHead(hidden_size, depth)` on Y-positions.

    Args:
        hidden_size: the draft's hidden size H (width of the features).
        depth: residual blocks D of the head (0 = linear probe).
        w_acc, w_rej: weights of the accept / reject terms of the BCE (paper: 1 and 6).
        lr: peak learning rate.
        weight_decay: Adam's L2 penalty, or AdamW's decoupled decay.
        betas: Adam betas.
        optimizer: "adam" (the paper's) or "adamw".
        schedule: "cosine" (decay to 0 over all steps, the paper's) or "constant".
        warmup: fraction of all steps spent in linear warm-up from 0.
        ece_bins: bins of the calibration error.
        draft: frozen draft for on-the-fly features; None with cached features. Not a submodule: it stays
            out of checkpoints, the optimiser and DDP (see `acchead.train.draft`).
        kind: "candidate" or "lookahead" (DESIGN §3.1).
        inputs: the head's inputs (`acchead.lookahead.LOOKAHEAD_INPUTS`); ("state",) for candidate heads.
        sampling: S of the data, as `SamplingConfig.to_dict()`; a lookahead head's log q / entropy inputs
            are computed under it in the on-the-fly mode (the cached mode assembles inputs in the dataset).
        width: width of the head's residual blocks; None = hidden_size.
    """

    def __init__(
        self,
        hidden_size: int,
        depth: int,
        w_acc: float = 1.0,
        w_rej: float = 6.0,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.999),
        optimizer: Literal["adam", "adamw"] = "adam",
        schedule: Literal["cosine", "constant"] = "cosine",
        warmup: float = 0.0,
        ece_bins: int = 15,
        draft: FrozenDraft | None = None,
        kind: str = "candidate",
        inputs: tuple[str, ...] | list[str] = ("state",),
        sampling: dict | None = None,
        width: int | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["draft"])
        self.head = AcceptanceHead(hidden_size, depth, kind, tuple(inputs), width=width)
        self.sampling = SamplingConfig.from_dict(sampling) if sampling else SamplingConfig()
        self.draft = draft  # a plain attribute: FrozenDraft is not an nn.Module, so it is not registered
        # One metric collection per split, keyed "split_<name>" ("train" would shadow nn.Module.train).
        # Metric states are non-persistent: they never enter checkpoints.
        self.metrics = nn.ModuleDict(
            {f"split_{split}": HeadMetrics(w_acc, w_rej, ece_bins) for split in ("val", "train")}
        )
        # Which split each evaluation dataloader holds; the final evaluation sets ["val", "train"].
        self.eval_splits: list[str] = ["val"]
        # {split: {metric: value}} of the latest evaluation, computed across all processes.
        self.results: dict[str, dict[str, float]] = {}

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """features: (..., input_size) -> logits (...)."""
        return self.head(features)

    def _positions(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Features (N, H), soft labels (N,) and hard labels (N,) of the batch's Y-positions."""
        if "features" in batch:
            return batch["features"], batch["labels"], batch["hard"]
        if self.draft is None:
            raise RuntimeError("a token batch needs the frozen draft (on-the-fly mode) but none was given")
        if self.draft.device != self.device:
            self.draft.to(self.device)  # Lightning moves registered submodules only
        hidden = self.draft(batch["input_ids"], batch["attention_mask"])  # (B, T, H), no grad
        mask = batch["target_mask"]
        features = hidden[mask]  # (N, H)
        if self.head.inputs != ("state",):
            if "depth" in self.head.inputs:  # refused before training by acchead.train.fit
                raise RuntimeError("a head reading 'depth' trains on cached states only")
            out_emb = output_embedding_table(self.draft.model)  # (V, H)
            features = lookahead_inputs(
                self.head.inputs, features, batch["candidates"][mask], out_emb, self.sampling
            )
        return features, batch["labels"][mask], batch["hard"][mask]

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        features, labels, _ = self._positions(batch)
        logits = self.head(features)
        hp = self.hparams
        loss = weighted_bce_with_logits(logits, labels, w_acc=hp.w_acc, w_rej=hp.w_rej)
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True, batch_size=len(labels))
        return loss

    def validation_step(
        self, batch: dict[str, torch.Tensor], batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        features, labels, hard = self._positions(batch)
        self.metrics[f"split_{self.eval_splits[dataloader_idx]}"].update(self.head(features), labels, hard)

    def on_validation_epoch_end(self) -> None:
        for split in self.eval_splits:
            metrics = self.metrics[f"split_{split}"]
            values = metrics.compute()  # all-reduces/gathers metric states across processes
            metrics.reset()
            self.results[split] = {name: float(v) for name, v in values.items()}
            # Already synchronised by torchmetrics, so no sync_dist here.
            self.log_dict({f"{split}/{k}": v for k, v in values.items()}, add_dataloader_idx=False)

    def configure_optimizers(self):
        hp = self.hparams
        cls = torch.optim.Adam if hp.optimizer == "adam" else torch.optim.AdamW
        opt = cls(self.head.parameters(), lr=hp.lr, betas=tuple(hp.betas), weight_decay=hp.weight_decay)
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warm = int(hp.warmup * total)
        cosine = hp.schedule == "cosine"

        def factor(step: int) -> float:
            if step < warm:
                return (step + 1) / warm
            if not cosine:
                return 1.0
            progress = min(1.0, (step - warm) / max(1, total - warm))
            return 0.5 * (1.0 + math.cos(math.pi * progress))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
