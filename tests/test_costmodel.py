"""Cost model: the least-squares fit recovers known unit costs, and the derived rates follow eq. 2.1–2.3."""

from __future__ import annotations

import numpy as np
import pytest

from acchead.errors import AccheadError
from acchead.inference.bench.costmodel import (
    CostFit,
    RunCounts,
    aggregate,
    fit_costs,
    modeled_tokens_per_s,
    ratio_speedup,
)


def test_fit_recovers_true_coefficients_from_noisy_runs():
    rng = np.random.default_rng(0)
    nd = rng.integers(0, 400, size=200)
    nt = rng.integers(10, 120, size=200)
    wall = 0.002 * nd + 0.015 * nt + rng.normal(0, 1e-3, size=200)
    fit = fit_costs(nd, nt, wall)
    assert fit.t_draft == pytest.approx(0.002, rel=0.02)
    assert fit.t_target == pytest.approx(0.015, rel=0.02)
    assert 0.99 < fit.r2 <= 1.0
    assert fit.n_runs == 200


def test_fit_is_exact_without_noise():
    nd = [0, 10, 40, 7]
    nt = [30, 12, 9, 20]
    wall = [0.5 * a + 3.0 * b for a, b in zip(nd, nt, strict=True)]
    fit = fit_costs(nd, nt, wall)
    assert (fit.t_draft, fit.t_target) == pytest.approx((0.5, 3.0))
    assert fit.r2 == pytest.approx(1.0)


def test_fit_clamps_negative_coefficient_to_zero():
    # Wall time falls with draft calls in this data: the unconstrained fit has t_draft < 0, which the
    # model forbids; the constrained optimum puts all cost on the target.
    nd = np.array([0.0, 10.0, 20.0, 30.0])
    nt = np.array([10.0, 10.0, 11.0, 12.0])
    wall = 1.0 * nt - 0.1 * nd
    unconstrained, *_ = np.linalg.lstsq(np.stack([nd, nt], 1), wall, rcond=None)
    assert unconstrained[0] < 0
    fit = fit_costs(nd, nt, wall)
    assert fit.t_draft == 0.0
    assert fit.t_target == pytest.approx(float(nt @ wall / (nt @ nt)))


def test_fit_handles_autoregressive_only_runs():
    # No draft calls at all: the draft column is zero, t_draft must come out 0, not NaN.
    fit = fit_costs([0, 0, 0], [5, 10, 20], [0.5, 1.0, 2.0])
    assert fit.t_draft == 0.0
    assert fit.t_target == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("nd", "nt", "wall", "msg"),
    [
        ([1], [1], [1.0], "at least 2"),
        ([1, 2], [1, 2], [1.0], "wall times"),
        ([0, 0], [0, 0], [1, 2], "no forward"),
    ],
)
def test_fit_rejects_bad_input(nd, nt, wall, msg):
    with pytest.raises(AccheadError, match=msg):
        fit_costs(nd, nt, wall)


def test_aggregate_rates_and_throughputs():
    fit = CostFit(t_draft=0.01, t_target=0.1, r2=1.0, n_runs=2)
    runs = [
        RunCounts(tokens=30, target_calls=10, draft_calls=40, discarded=20, wall_time=1.0),
        RunCounts(tokens=10, target_calls=5, draft_calls=10, discarded=5, wall_time=1.0),
    ]
    m = aggregate(runs, fit)
    assert (m.tokens, m.target_calls, m.draft_calls, m.discarded) == (40, 15, 50, 25)
    assert m.verification_rate == pytest.approx(15 / 40)
    assert m.discard_rate == pytest.approx(25 / 40)
    assert m.modeled_tokens_per_s == pytest.approx(40 / (0.01 * 50 + 0.1 * 15))
    assert m.wall_tokens_per_s == pytest.approx(20.0)
    # Eq. 2.2 holds for these counts, as for every token-verification run.
    assert m.draft_calls + m.target_calls == m.tokens + m.discarded


def test_autoregressive_modeled_throughput_is_one_over_t_target():
    fit = CostFit(t_draft=0.01, t_target=0.05, r2=1.0, n_runs=2)
    assert modeled_tokens_per_s(100, 0, 100, fit) == pytest.approx(20.0)
    assert modeled_tokens_per_s(0, 0, 0, fit) == 0.0


def test_ratio_speedup_prices_forwards_at_a_declared_cost_ratio():
    """N / (c·N_draft + N_target): autoregressive is 1× at any c; a free draft (c = 0) gives N / N_target."""
    assert ratio_speedup(64, 0, 64, 0.2) == 1.0
    # 16 rounds of 4 drafted candidates, all accepted: 64 tokens, 64 draft and 16 target forwards.
    assert ratio_speedup(64, 64, 16, 0.2) == pytest.approx(64 / (0.2 * 64 + 16))
    assert ratio_speedup(64, 64, 16, 0.0) == 4.0
    assert ratio_speedup(0, 0, 0, 0.1) == 0.0
    # The fitted model's speedup over autoregressive when its t_draft / t_target equals c.
    fit = CostFit(t_draft=0.002, t_target=0.02, r2=1.0, n_runs=2)
    fitted = modeled_tokens_per_s(64, 64, 16, fit) / modeled_tokens_per_s(64, 0, 64, fit)
    assert ratio_speedup(64, 64, 16, 0.1) == pytest.approx(fitted)
