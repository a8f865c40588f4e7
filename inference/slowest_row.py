"""How many rounds a batch decoding in lockstep has left: its slowest row's (the round gate's N_k,
`acchead.inference.round_gate`).

Rounds capped at k candidates advance row b by g_k tokens each, mean μ_{b,k}, variance v_k; with m_b tokens
left it needs T_b ≈ m_b / μ_{b,k} rounds, and the batch needs E[max_b T_b]. Two models of how T_b spreads:

- `normal_rounds`: T_b normal, with the renewal-theory deviation √(m_b·v_k / μ³) widened by the doubt left
  in μ_{b,k}; E[max] ≈ max_b (m_b / μ_{b,k} + e_R·σ_{b,k}), e_R the expected max of R standard normals.
  Symmetric, so it under-reaches a skewed spread: on the toy pair's 64 HumanEval prompts under K = 3 it put
  the slowest of 64 rows at 31.1 rounds, the rows' own rounds at 35 (docs/batched.md).
- `empirical_rounds`: rows decoded before (`RowAtoms`: each one's mean gain under each cap and its
  rounds) give the shape of how rows differ: their standardized deviations from the atoms' mean, drawn
  in place of the normal's. A row's mean is its own rounds' shrunk towards the atoms' (normal-normal, as
  the normal model does), its rate over its remaining rounds that mean plus a drawn deviation, and
  P(max_b T_b <= t) = Π_b P(T_b <= t) is read on a grid. From the rows of the same 64 prompts (decoded
  under K = 3) it puts the slowest of 64 at 35.2 rounds; from those of K = 6's rounds, priced for a cap of
  3 (one round's gains price every smaller cap, `acchead.inference.round_gate`), at 38.1.

Both read only rounds already verified, so a gate choosing by them keeps every row an exact sample of the
target.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist

import torch

from acchead.errors import AccheadError

MIN_ATOMS = 16  # earlier rows with rounds under a cap before `empirical_rounds` prices it


def expected_max_normal(n: int) -> float:
    """E[max of n iid standard normals] by Blom's approximation: 0 at n = 1, 1.05 at 4 (exactly 1.03), 1.77 at
    16 (1.77), 2.34 at 64 (2.42)."""
    if n < 1:
        raise AccheadError(f"need n >= 1 rows, got {n}")
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25)) if n > 1 else 0.0


def normal_rounds(m: torch.Tensor, mu: torch.Tensor, var: torch.Tensor, doubt: torch.Tensor) -> torch.Tensor:
    """(K,) N_k under the normal model: `m` (R, 1) tokens left per row, `mu` (R, K) each row's mean gain,
    `var` (K,) a round's gain variance, `doubt` (R, K) the variance left in a row's mean gain."""
    spread = (m * var / mu**3 + m**2 * doubt / mu**4).sqrt()  # (R, K)
    return (m / mu + expected_max_normal(m.shape[0]) * spread).amax(0)


@dataclass(frozen=True)
class RowAtoms:
    """Rows decoded before, one atom each: `n` (J, K) its rounds counted under each cap (0: none) and `mean`
    (J, K) its mean gain under each cap (0 where n is)."""

    n: torch.Tensor
    mean: torch.Tensor

    def __len__(self) -> int:
        return self.n.shape[0]

    def __add__(self, other: RowAtoms) -> RowAtoms:
        return RowAtoms(torch.cat([self.n, other.n]), torch.cat([self.mean, other.mean]))

    def last(self, count: int) -> RowAtoms:
        """The `count` (>= 0) most recent atoms."""
        start = max(len(self) - count, 0)
        return RowAtoms(self.n[start:], self.mean[start:])


def empirical_rounds(
    m: torch.Tensor,
    own_n: torch.Tensor,
    own_mean: torch.Tensor,
    var: torch.Tensor,
    atoms: RowAtoms,
    centre: torch.Tensor | None = None,
    spread: torch.Tensor | None = None,
    min_atoms: int = MIN_ATOMS,
    grid: int = 128,
) -> torch.Tensor:
    """(K,) N_k from earlier rows (module docstring); all NaN where no cap has `min_atoms` of them.

    Under cap k the atoms' mean gains x_j, each over n_j rounds, have mean x̄ and spread t + v / n_j, t the
    rows' true spread (their variance less the rounds' mean noise); their standardized deviations z_j are
    the shape of how rows differ. A cap with fewer atoms (a decode that chose cap c prices only caps up to
    c) takes its x̄ and t from `centre` and `spread` (the pooled tallies' mean of row means and between-row
    variance) and the shape of the nearest cap below it that has them (else above): every cap is then
    priced by one model, so a cap is not preferred for being the one measured less. Row b's true mean has
    the prior x̄ ± √t and its own n_b rounds' mean, so μ_b = (n_b·own + (v / t)·x̄) / (n_b + v / t) with
    doubt v / (n_b + v / t); its rate over its remaining h_b = m_b / μ_b rounds is r = μ_b + z·√(doubt +
    v / h_b), z drawn from the shape, within [1, k + 1], and it needs T_b = m_b / r rounds.
    P(max_b T_b <= t) = Π_b P(r_b >= m_b / t) is read at `grid` points between the largest of the rows'
    fewest rounds and the largest of their most (high by less than a spacing).

    Args:
        m: (R, 1) tokens left per row decoding.
        own_n: (R, K) each row's own rounds under each cap; own_mean: (R, K) their mean gain.
        var: (K,) a round's gain variance under each cap (pooled).
        atoms: the earlier rows.
        centre, spread: (K,) the fallback x̄ and t of caps with too few atoms (None: such caps are NaN).
    """
    var = var.double()
    caps = var.shape[0]
    seen = (atoms.n > 0).T  # (K, J) the atoms that priced each cap
    count = seen.sum(1, keepdim=True).double()  # (K, 1)
    usable = count[:, 0] >= min_atoms  # (K,)
    if not bool(usable.any()):
        return torch.full_like(var, float("nan"))
    n_j = atoms.n.T.clamp_min(1.0)  # (K, J)
    x = torch.where(seen, atoms.mean.T, 0.0)
    v = var.clamp_min(1e-9)[:, None]  # (K, 1)
    mean = x.sum(1, keepdim=True) / count.clamp_min(1.0)
    dev = torch.where(seen, x - mean, 0.0)
    noise = torch.where(seen, v / n_j, 0.0)
    true = dev.pow(2).sum(1, keepdim=True) / (count - 1).clamp_min(1) - noise.sum(1, keepdim=True) / count
    true = true.clamp_min(1e-12)  # (K, 1) the rows' true spread
    z = torch.where(seen, dev / (true + v / n_j).sqrt(), float("inf")).sort(1).values  # (K, J), unseen last
    # each cap's shape from the nearest cap with enough atoms, at or below it, else above
    index = torch.arange(caps)
    donor = torch.where(usable, index, -1).cummax(0).values
    donor = torch.where(donor < 0, index[usable][0], donor)
    z, count = z[donor], count[donor]
    if centre is not None and spread is not None:
        mean = torch.where(usable[:, None], mean, centre.double()[:, None])
        true = torch.where(usable[:, None], true, spread.double().clamp_min(1e-12)[:, None])
    # each row's true mean and the doubt left in it (normal-normal), its rate's spread: (K, R)
    weight = v / true
    rows_n, rows_x = own_n.T.double(), own_mean.T.double()
    top = index.double()[:, None] + 2.0  # (K, 1) a gain is at most k + 1 (cap k = index + 1)
    mu = torch.minimum(((rows_n * rows_x + weight * mean) / (rows_n + weight)).clamp_min(1.0), top)
    left = m.T.double()  # (1, R)
    sigma = (v / (rows_n + weight) + v * mu / left.clamp_min(1.0)).sqrt()
    z_hi = torch.where(z.isfinite(), z, float("-inf")).amax(1, keepdim=True)
    fewest = left / torch.minimum((mu + z_hi * sigma).clamp_min(1.0), top)  # (K, R) a row's fewest rounds
    most = left / torch.minimum((mu + z[:, :1] * sigma).clamp_min(1.0), top)  # and most
    lo, hi = fewest.amax(1, keepdim=True), most.amax(1, keepdim=True)  # (K, 1) where P(max <= t) rises
    points = lo + (hi - lo) * torch.linspace(0.0, 1.0, grid, dtype=torch.float64)  # (K, G)
    need = left[:, :, None] / points[:, None, :]  # (K, R, G) the rate row b needs to finish within t
    u = (need - mu[:, :, None]) / sigma[:, :, None]
    under = torch.searchsorted(z, u.flatten(1), right=False).view_as(u)  # atoms with z < u
    done = 1.0 - under / count[:, :, None]  # P(r_b >= need)
    done = torch.where(need <= 1.0, 1.0, torch.where(need > top[:, :, None], 0.0, done))
    below = done.clamp(0.0, 1.0).prod(1)  # (K, G) P(max <= t)
    below[:, -1] = 1.0
    out = (points * torch.diff(below, prepend=torch.zeros_like(below[:, :1]))).sum(1)
    priced = usable | (centre is not None and spread is not None)
    return torch.where(priced, out, float("nan"))
