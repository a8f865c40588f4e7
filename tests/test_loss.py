"""Weighted soft-label BCE and binary KL against values computed by hand with `math`."""

from __future__ import annotations

import math

import pytest
import torch

from acchead.loss import binary_kl, weighted_bce_with_logits

LOGITS = [0.0, 2.0, -1.0, 0.5]
LABELS = [0.5, 1.0, 0.2, 0.0]


def _sig(f: float) -> float:
    return 1 / (1 + math.exp(-f))


def _bce(f: float, p: float, w_acc: float = 1.0, w_rej: float = 1.0) -> float:
    return -(w_acc * p * math.log(_sig(f)) + w_rej * (1 - p) * math.log(1 - _sig(f)))


def _kl(p: float, f: float) -> float:
    q = _sig(f)
    out = 0.0 if p == 0 else p * math.log(p / q)
    return out + (0.0 if p == 1 else (1 - p) * math.log((1 - p) / (1 - q)))


@pytest.mark.parametrize(("w_acc", "w_rej"), [(1.0, 1.0), (1.0, 6.0), (2.0, 3.0)])
def test_bce_matches_hand_computed(w_acc, w_rej):
    logits, labels = torch.tensor(LOGITS), torch.tensor(LABELS)
    expected = [_bce(f, p, w_acc, w_rej) for f, p in zip(LOGITS, LABELS, strict=True)]
    got = weighted_bce_with_logits(logits, labels, w_acc=w_acc, w_rej=w_rej, reduction="none")
    torch.testing.assert_close(got, torch.tensor(expected))
    mean = weighted_bce_with_logits(logits, labels, w_acc=w_acc, w_rej=w_rej)
    assert mean.item() == pytest.approx(sum(expected) / 4, rel=1e-6)
    total = weighted_bce_with_logits(logits, labels, w_acc=w_acc, w_rej=w_rej, reduction="sum")
    assert total.item() == pytest.approx(sum(expected), rel=1e-6)


def test_bce_mask_averages_over_kept_positions_only():
    logits, labels = torch.tensor([LOGITS, LOGITS]), torch.tensor([LABELS, LABELS])
    mask = torch.tensor([[True, False, True, False], [False, False, False, True]])
    kept = [_bce(LOGITS[i], LABELS[i], 1, 6) for i in (0, 2, 3)]
    got = weighted_bce_with_logits(logits, labels, mask, w_rej=6.0)
    assert got.item() == pytest.approx(sum(kept) / 3, rel=1e-6)
    per_pos = weighted_bce_with_logits(logits, labels, mask, w_rej=6.0, reduction="none")
    assert per_pos[~mask].abs().sum() == 0
    # Nothing kept: 0, not nan (an all-target batch must not poison training).
    none_kept = weighted_bce_with_logits(logits, labels, torch.zeros_like(mask))
    assert none_kept.item() == 0.0


def test_bce_extreme_logits_are_finite_and_right():
    logits = torch.tensor([100.0, -100.0, 1e4, -1e4], requires_grad=True)
    labels = torch.tensor([1.0, 1.0, 0.0, 0.0])
    loss = weighted_bce_with_logits(logits, labels, reduction="none")
    # Confident and right costs ~0; confident and wrong costs |f| (log σ(-f) ≈ -f for f >> 0).
    torch.testing.assert_close(loss, torch.tensor([0.0, 100.0, 1e4, 0.0]))
    loss.sum().backward()
    assert torch.isfinite(logits.grad).all()
    torch.testing.assert_close(logits.grad, torch.tensor([0.0, -1.0, 1.0, 0.0]))


def test_bce_rejects_unknown_reduction():
    with pytest.raises(ValueError, match="reduction"):
        weighted_bce_with_logits(torch.zeros(2), torch.zeros(2), reduction="max")


def test_binary_kl_matches_hand_computed_including_hard_labels():
    labels = [0.0, 1.0, 0.3, 0.3, 1.0, 0.0, 0.5]
    logits = [0.7, -0.4, 0.0, -2.0, 3.0, -3.0, 0.0]
    got = binary_kl(torch.tensor(labels), torch.tensor(logits))
    torch.testing.assert_close(got, torch.tensor([_kl(p, f) for p, f in zip(labels, logits, strict=True)]))
    # P = 0 reduces to -log(1 - P̂), P = 1 to -log P̂.
    assert got[0].item() == pytest.approx(-math.log(1 - _sig(0.7)), rel=1e-6)
    assert got[1].item() == pytest.approx(-math.log(_sig(-0.4)), rel=1e-6)
    assert got[-1].item() == pytest.approx(0.0, abs=1e-7)


def test_binary_kl_is_zero_at_the_truth_and_finite_at_extremes():
    p = torch.tensor([0.1, 0.5, 0.9, 0.999])
    assert binary_kl(p, torch.logit(p)).abs().max() < 1e-5
    extreme = binary_kl(torch.tensor([1.0, 0.0, 0.5]), torch.tensor([-1e4, 1e4, 1e4]))
    assert torch.isfinite(extreme).all()
    torch.testing.assert_close(extreme[:2], torch.tensor([1e4, 1e4]))


def test_binary_kl_is_bce_minus_label_entropy():
    gen = torch.Generator().manual_seed(0)
    p, f = torch.rand(100, generator=gen), 3 * torch.randn(100, generator=gen)
    entropy = -(p * p.log() + (1 - p) * (1 - p).log())
    bce = weighted_bce_with_logits(f, p, reduction="none")
    torch.testing.assert_close(binary_kl(p, f), bce - entropy, rtol=1e-4, atol=1e-5)
