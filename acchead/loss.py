"""Weighted soft-label BCE (the training loss) and the unweighted binary KL (the paper's eval metric)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def weighted_bce_with_logits(
    logits: torch.Tensor,
    labels: torch.Tensor,
    mask: torch.Tensor | None = None,
    w_acc: float = 1.0,
    w_rej: float = 1.0,
    reduction: str = "mean",
) -> torch.Tensor:
    """`-w_acc·P·log σ(f) - w_rej·(1-P)·log(1-σ(f))`, computed with log-sigmoid for stability.

    Args:
        logits: (...) head outputs f.
        labels: (...) soft labels P in [0, 1] (the exact acceptance probabilities).
        mask: (...) bool, True where the loss counts (the positions taken from the draft); None = all.
        reduction: "mean" over masked positions, "sum", or "none" (masked positions set to 0).
    """
    logits = logits.float()
    labels = labels.float()
    # log(1 - σ(f)) = log σ(-f)
    per_pos = -(w_acc * labels * F.logsigmoid(logits) + w_rej * (1 - labels) * F.logsigmoid(-logits))
    if mask is not None:
        per_pos = per_pos * mask.to(per_pos.dtype)
    if reduction == "none":
        return per_pos
    if reduction == "sum":
        return per_pos.sum()
    if reduction == "mean":
        n = per_pos.numel() if mask is None else mask.sum()
        return per_pos.sum() / torch.clamp(torch.as_tensor(n, dtype=per_pos.dtype), min=1)
    raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def binary_kl(labels: torch.Tensor, logits: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Per-position `P·log(P/P̂) + (1-P)·log((1-P)/(1-P̂))` with P̂ = σ(logits); shape of the inputs.

    Terms with P = 0 or P = 1 use the limit 0·log 0 = 0; log P̂ comes from log-sigmoid, so P̂ near 0 or 1
    never produces inf. `eps` only guards log(P) of labels.
    """
    p = labels.float().clamp(0.0, 1.0)
    logits = logits.float()
    pos = torch.where(p > 0, p * (torch.log(p.clamp(min=eps)) - F.logsigmoid(logits)), torch.zeros_like(p))
    neg = torch.where(p < 1, (1 - p) * (torch.log((1 - p).clamp(min=eps)) - F.logsigmoid(-logits)),
                      torch.zeros_like(p))
    return pos + neg
