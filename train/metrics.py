"""Validation metrics for the acceptance head, as torchmetrics (so they are exact across DDP processes),
plus the analytic best constant predictor that every trained head must beat.

Two kinds of targets per Y-position:
- the soft label P (the exact acceptance probability): binary KL, weighted BCE and the Brier score;
- a hard label: the realised accept/reject event, a Bernoulli(P) draw made once per position with a fixed
  seed (see `acchead.train.data.hard_labels`). That is the event the decoder actually sees, so calibration
  error and AUROC are measured against it. Thresholding 1[P >= 0.5] instead would throw away exactly the
  uncertainty the head is meant to predict (a P = 0.55 position is "accept" 45% of the time), and the
  fixed per-position draw keeps the metric repeatable and independent of batching and process count.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torchmetrics import Metric, MetricCollection
from torchmetrics.classification import BinaryAUROC, BinaryCalibrationError
from torchmetrics.regression import MeanSquaredError

from acchead.loss import binary_kl, weighted_bce_with_logits

# Display order and names of the metrics in tables and metrics.json.
METRIC_NAMES = ("kl", "weighted_bce", "brier", "ece", "auroc")


class _MeanOfPerPosition(Metric):
    """Mean of a per-position quantity, with sum/count states reduced by summation across processes."""

    full_state_update = False
    higher_is_better = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("total", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def _per_position(self, logits: Tensor, labels: Tensor) -> Tensor:
        raise NotImplementedError

    def update(self, logits: Tensor, labels: Tensor) -> None:
        """logits, labels: (N,) head logits and soft labels P of N positions."""
        values = self._per_position(logits, labels)
        # float64 accumulation: millions of positions summed in float32 lose digits the table shows.
        self.total += values.double().sum()
        self.count += values.numel()

    def compute(self) -> Tensor:
        return (self.total / self.count.clamp(min=1)).float()


class BinaryKL(_MeanOfPerPosition):
    """Mean unweighted binary KL(P ‖ σ(f)) over positions: the paper's Table 3 metric."""

    def _per_position(self, logits: Tensor, labels: Tensor) -> Tensor:
        return binary_kl(labels, logits)


class WeightedBCE(_MeanOfPerPosition):
    """Mean weighted soft-label BCE over positions: the training loss, on held-out data."""

    def __init__(self, w_acc: float = 1.0, w_rej: float = 1.0, **kwargs) -> None:
        super().__init__(**kwargs)
        self.w_acc = w_acc
        self.w_rej = w_rej

    def _per_position(self, logits: Tensor, labels: Tensor) -> Tensor:
        return weighted_bce_with_logits(logits, labels, w_acc=self.w_acc, w_rej=self.w_rej, reduction="none")


class HeadMetrics(MetricCollection):
    """All evaluation metrics of one split; `update(logits, labels, hard)` with (N,) tensors each."""

    def __init__(self, w_acc: float, w_rej: float, ece_bins: int = 15) -> None:
        super().__init__(
            {
                "kl": BinaryKL(),
                "weighted_bce": WeightedBCE(w_acc=w_acc, w_rej=w_rej),
                "brier": MeanSquaredError(),
                "ece": BinaryCalibrationError(n_bins=ece_bins, norm="l1"),
                # thresholds=None: exact AUROC from all scores (they are gathered across processes).
                "auroc": BinaryAUROC(thresholds=None),
            },
            compute_groups=False,
        )

    def update(self, logits: Tensor, labels: Tensor, hard: Tensor) -> None:  # type: ignore[override]
        """logits: (N,) head logits; labels: (N,) soft labels P; hard: (N,) 0/1 realised accept events."""
        logits = logits.detach().float()
        labels = labels.float()
        probs = torch.sigmoid(logits)
        hard = hard.long()
        self["kl"].update(logits, labels)
        self["weighted_bce"].update(logits, labels)
        self["brier"].update(probs, labels)
        self["ece"].update(probs, hard)
        self["auroc"].update(probs, hard)


def best_constant(labels: Tensor, w_acc: float = 1.0, w_rej: float = 1.0) -> dict[str, float]:
    """The best constant predictors on `labels` (N,) and their losses, in closed form.

    For weighted BCE with soft labels, d/dc of `-w_acc·ΣP·log c - w_rej·Σ(1-P)·log(1-c)` vanishes at
    `c* = w_acc·ΣP / (w_acc·ΣP + w_rej·Σ(1-P))`; for the unweighted KL it is the mean label. Both are
    fitted on the evaluated split itself, so they lower-bound every constant predictor there: a head
    that beats them has learned something from its features.

    Returns: `{"sigma_weighted_bce", "weighted_bce", "sigma_kl", "kl"}`.
    """
    p = labels.double().clamp(0.0, 1.0)
    n = max(p.numel(), 1)
    s_acc, s_rej = p.sum().item(), (1 - p).sum().item()
    sigma = w_acc * s_acc / max(w_acc * s_acc + w_rej * s_rej, 1e-300)
    # Clamp away from {0, 1} only where the sums are 0, so 0·log 0 stays 0 and never becomes nan.
    sigma_c = min(max(sigma, 1e-12), 1 - 1e-12)
    wbce = -(w_acc * s_acc * math.log(sigma_c) + w_rej * s_rej * math.log(1 - sigma_c)) / n
    mean = s_acc / n
    logit_mean = math.log(max(mean, 1e-12)) - math.log(max(1 - mean, 1e-12))
    kl = binary_kl(p.float(), torch.full_like(p, logit_mean).float()).double().mean().item()
    return {"sigma_weighted_bce": sigma, "weighted_bce": wbce, "sigma_kl": mean, "kl": kl}
