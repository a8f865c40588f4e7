"""The speculative-decoding cost model of the paper (eq. 2.1–2.3) and the metrics derived from it.

A run that generates N tokens with N_draft draft forwards and N_target target forwards costs

    T = t_draft · N_draft + t_target · N_target                                   (eq. 2.1)

and, for token verification, N_draft + N_target = N + N_discarded (eq. 2.2): every forward either yields a
kept token or a token that is thrown away. Modelled throughput is N / T (eq. 2.3). The two unit costs are
fitted by least squares over per-prompt wall times (paper §4.2): no intercept (a run with no forwards takes
no time) and non-negative coefficients (a forward cannot save time). The verification rate N_target / N and
the discard rate N_discarded / N are hardware-independent and are what the Pareto plot shows. Beside the
fitted costs, runs can be priced at a declared ratio c = t_draft / t_target (`ratio_speedup`), since unit
costs fitted on one machine do not transfer to another.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from acchead.errors import AccheadError


@dataclass(frozen=True)
class RunCounts:
    """Counts of one decoding run (one prompt under one method and setting).

    Attributes:
        tokens: N, generated tokens.
        target_calls: N_target, target forward passes.
        draft_calls: N_draft, draft forward passes.
        discarded: N_discarded, drafted or computed tokens that were thrown away.
        wall_time: seconds the run took (only used for fitting and wall-clock throughput).
    """

    tokens: int
    target_calls: int
    draft_calls: int
    discarded: int
    wall_time: float = 0.0


@dataclass(frozen=True)
class CostFit:
    """Fitted unit costs (seconds per forward) and the fit's coefficient of determination.

    `r2` is the usual centred R² = 1 − SS_res / SS_tot (SS_tot around the mean wall time); it can be
    negative when the no-intercept model fits worse than a constant.
    """

    t_draft: float
    t_target: float
    r2: float
    n_runs: int

    def predict(self, draft_calls: float, target_calls: float) -> float:
        """Modelled seconds of a run with the given forward counts (eq. 2.1)."""
        return self.t_draft * draft_calls + self.t_target * target_calls

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


def fit_costs(
    draft_calls: Sequence[float], target_calls: Sequence[float], wall_times: Sequence[float]
) -> CostFit:
    """Least-squares fit of `wall ≈ t_draft·draft_calls + t_target·target_calls`, no intercept, t ≥ 0.

    With two coefficients the non-negative least-squares problem is solved exactly by enumeration: the
    unconstrained solution if both coefficients are ≥ 0, otherwise the best of the two one-variable fits
    (each clamped at 0). Inputs are per-run sequences of equal length (R,).

    Raises:
        AccheadError: fewer than 2 runs, mismatched lengths, or no forward counted at all.
    """
    x = np.stack([np.asarray(draft_calls, dtype=np.float64), np.asarray(target_calls, dtype=np.float64)], 1)
    y = np.asarray(wall_times, dtype=np.float64)
    if x.shape[0] != y.shape[0]:
        raise AccheadError(f"cost fit: {x.shape[0]} count rows but {y.shape[0]} wall times")
    if y.shape[0] < 2:
        raise AccheadError(f"cost fit needs at least 2 runs, got {y.shape[0]}")
    if not np.any(x):
        raise AccheadError("cost fit: no forward passes were counted")

    candidates: list[np.ndarray] = []
    # lstsq returns the minimum-norm solution when the design is rank-deficient (e.g. only
    # autoregressive runs: draft_calls all zero), which is still a valid least-squares point.
    full, *_ = np.linalg.lstsq(x, y, rcond=None)
    if np.all(full >= 0):
        candidates.append(full)
    for j in range(2):
        col = x[:, j]
        denom = float(col @ col)
        coef = np.zeros(2)
        coef[j] = max(0.0, float(col @ y) / denom) if denom > 0 else 0.0
        candidates.append(coef)
    best = min(candidates, key=lambda c: float(np.sum((y - x @ c) ** 2)))

    ss_res = float(np.sum((y - x @ best) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res == 0 else 0.0)
    return CostFit(t_draft=float(best[0]), t_target=float(best[1]), r2=r2, n_runs=int(y.shape[0]))


@dataclass(frozen=True)
class Metrics:
    """Aggregate metrics of a set of runs (one method and setting over all prompts)."""

    tokens: int
    target_calls: int
    draft_calls: int
    discarded: int
    wall_time: float
    verification_rate: float
    discard_rate: float
    modeled_tokens_per_s: float
    wall_tokens_per_s: float

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


def modeled_tokens_per_s(tokens: float, draft_calls: float, target_calls: float, fit: CostFit) -> float:
    """Eq. 2.3: N / (t_draft·N_draft + t_target·N_target); 0 when the modelled time is 0."""
    t = fit.predict(draft_calls, target_calls)
    return tokens / t if t > 0 else 0.0


def ratio_speedup(tokens: float, draft_calls: float, target_calls: float, ratio: float) -> float:
    """Modelled speedup over autoregressive decoding at a declared cost ratio c = t_draft / t_target.

    In target-forward units a run costs c·N_draft + N_target, and autoregressive decoding of the same N
    tokens costs N (one target forward per token), so the speedup is N / (c·N_draft + N_target) — for equal
    N, the N_ar_target / (c·N_draft + N_target) of eq. 2.3 with t_target = 1. Unlike the fitted costs, c
    is declared: a CPU fit, where verifying L tokens costs more than verifying one, does not transfer to
    GPUs. 0 when the run has no forward at all.
    """
    t = ratio * draft_calls + target_calls
    return tokens / t if t > 0 else 0.0


def aggregate(runs: Iterable[RunCounts], fit: CostFit) -> Metrics:
    """Sum the counts of `runs` and derive the rates and both throughputs.

    Rates are ratios of sums (not means of per-prompt ratios) so that long generations weigh more, as in
    the paper's totals.
    """
    runs = list(runs)
    n = sum(r.tokens for r in runs)
    nt = sum(r.target_calls for r in runs)
    nd = sum(r.draft_calls for r in runs)
    disc = sum(r.discarded for r in runs)
    wall = sum(r.wall_time for r in runs)
    return Metrics(
        tokens=n,
        target_calls=nt,
        draft_calls=nd,
        discarded=disc,
        wall_time=wall,
        verification_rate=nt / n if n else 0.0,
        discard_rate=disc / n if n else 0.0,
        modeled_tokens_per_s=modeled_tokens_per_s(n, nd, nt, fit),
        wall_tokens_per_s=n / wall if wall > 0 else 0.0,
    )
