"""The probes' shared fit: a standardised, L2-regularised logistic regression scored by validation AUROC."""

from __future__ import annotations

import torch
from torchmetrics.functional.classification import binary_auroc


def fit_auroc(x: torch.Tensor, y: torch.Tensor, train: torch.Tensor, val: torch.Tensor) -> float:
    """x (N, F) inputs, y (N,) labels in [0, 1], train / val (N,) bool masks -> AUROC on val of a logistic
    regression fit on train (inputs standardised by the training rows' mean and spread, L-BFGS)."""
    mu, sd = x[train].mean(0), x[train].std(0) + 1e-6
    x = (x - mu) / sd
    w = torch.zeros(x.shape[1], requires_grad=True)
    b = torch.zeros(1, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=200)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(x[train] @ w + b, y[train])
        loss = loss + 1e-3 * (w * w).sum()
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        return float(binary_auroc(x[val] @ w + b, y[val].long()))
