"""The slowest row's rounds (`acchead.inference.slowest_row`): the normal model's expected max and the
empirical model on earlier rows whose answer is known by hand."""

from __future__ import annotations

import math

import pytest
import torch

from acchead.errors import AccheadError
from acchead.inference.slowest_row import (
    MIN_ATOMS,
    RowAtoms,
    empirical_rounds,
    expected_max_normal,
    normal_rounds,
)

f64 = torch.float64


def test_expected_max_normal():
    assert expected_max_normal(1) == 0.0
    assert [round(expected_max_normal(n), 2) for n in (2, 4, 16, 64)] == [0.59, 1.05, 1.77, 2.34]
    with pytest.raises(AccheadError):
        expected_max_normal(0)


def _atoms(means: list[float], rounds: float = 20.0) -> RowAtoms:
    mean = torch.tensor(means, dtype=f64)[:, None]
    return RowAtoms(torch.full_like(mean, rounds), mean)


@pytest.mark.parametrize("rows", [1, 4, 64])
def test_empirical_rounds_of_noiseless_rows_are_their_order_statistics(rows):
    """Under cap 3, 40 earlier rows with no round-to-round noise, each gaining its own 1..4 tokens a round:
    a row of 60 tokens is one of them drawn at random, so the slowest of R needs E[max] = Σ_i T_(i)·((i/J)^R
    − ((i−1)/J)^R) rounds over the sorted T_j = 60 / x_j, within one grid spacing above."""
    gen = torch.Generator().manual_seed(0)
    x = 1.0 + 3.0 * torch.rand(40, generator=gen, dtype=f64)
    atoms = RowAtoms(torch.full((40, 3), 20.0, dtype=f64), x[:, None].expand(40, 3).contiguous())
    t = (60.0 / x).sort().values
    i, j = torch.arange(1, 41, dtype=f64), 40
    want = float((t * ((i / j) ** rows - ((i - 1) / j) ** rows)).sum())
    zero = torch.zeros(rows, 3, dtype=f64)
    got = float(empirical_rounds(torch.full((rows, 1), 60.0), zero, zero, torch.full((3,), 1e-9), atoms)[2])
    assert want - 1e-6 <= got <= want + float(t[-1] - t[0]) / 127


def test_empirical_rounds_reach_a_skewed_tail():
    """Under cap 1, 60 earlier rows gained 2 tokens every round, 4 only 1 (a hard prompt's), with no
    round-to-round noise: a row of 60 tokens takes 30 or 60 rounds. Alone its mean is (60·30 + 4·60) / 64 =
    31.875; the slowest of 64 takes 60 unless all 64 rows are easy ((60/64)^64 ≈ 1.6%): 59.52, where a
    normal model of the same mean and spread puts it at ~44."""
    atoms, var, zero = _atoms([2.0] * 60 + [1.0] * 4), torch.tensor([1e-6], dtype=f64), torch.zeros(64, 1)
    slow = 60 - 30 * (60 / 64) ** 64
    for rows, want in ((1, 31.875), (64, slow)):
        got = float(empirical_rounds(torch.full((rows, 1), 60.0), zero[:rows], zero[:rows], var, atoms)[0])
        assert abs(got - want) < 0.05, (rows, got, want)
    # the normal model of the same row spread: μ = the atoms' mean, the doubt their variance
    mean, spread = atoms.mean.mean(), atoms.mean.var()
    mu = torch.full((64, 1), float(mean), dtype=f64)
    normal = float(normal_rounds(torch.full((64, 1), 60.0, dtype=f64), mu, var, torch.full_like(mu, spread)))
    assert normal < 45 < slow


def test_empirical_rounds_weigh_a_rows_own_rounds():
    """Under cap 1, 60 earlier rows gained 2 tokens a round and 4 gained 1.5 (20 rounds each, v = 0.1): a
    fresh row of 60 tokens needs ~31 rounds alone. One whose own 10 rounds gained 1.5 each is slower: its
    mean shrinks towards the atoms' 1.97 by normal-normal (the rows' true spread t = 0.0149 − 0.1 / 20, the
    atoms' weight v / t ≈ 10 rounds against its own 10), to ~1.74, so it needs ~34.6. Under a cap with
    fewer than MIN_ATOMS earlier rows the answer is NaN (the gate then uses the normal model)."""
    atoms = RowAtoms(
        torch.tensor([[20.0, 20.0]] * 60 + [[20.0, 0.0]] * 4, dtype=f64),
        torch.tensor([[2.0, 2.5]] * 60 + [[1.5, 0.0]] * 4, dtype=f64),
    )
    var, m, none = torch.tensor([0.1, 0.1], dtype=f64), torch.tensor([[60.0]]), torch.zeros(1, 2)
    fresh = float(empirical_rounds(m, none, none, var, atoms)[0])
    slow = float(empirical_rounds(m, torch.tensor([[10.0, 0.0]]), torch.tensor([[1.5, 0.0]]), var, atoms)[0])
    assert 30 < fresh < 32 and 34 < slow < 35.5
    few = RowAtoms(atoms.n[: MIN_ATOMS - 1], atoms.mean[: MIN_ATOMS - 1])
    assert empirical_rounds(m, none, none, var, few).isnan().all()


def test_a_cap_with_few_atoms_borrows_the_shape_of_one_with_enough():
    """Earlier rows priced cap 1 only (a decode that chose it): cap 2 takes cap 1's shape with the pooled
    tallies' centre and spread. Given cap 1's own (and rates that stay below 2, where the caps' bounds
    differ), it comes out as cap 1 does; without a fallback it is NaN."""
    gen = torch.Generator().manual_seed(1)
    x = 1.5 + 0.3 * torch.rand(48, generator=gen, dtype=f64) ** 3  # a skewed spread
    means = torch.stack([x, torch.zeros(48, dtype=f64)], 1)
    atoms = RowAtoms(torch.tensor([[30.0, 0.0]] * 48, dtype=f64), means)
    var, m, none = torch.full((2,), 0.01, dtype=f64), torch.full((16, 1), 50.0), torch.zeros(16, 2)
    centre, spread = torch.full((2,), float(x.mean())), torch.full((2,), float(x.var() - 0.01 / 30))
    got = empirical_rounds(m, none, none, var, atoms, centre, spread)
    assert math.isclose(got[0], got[1], rel_tol=1e-6)
    assert empirical_rounds(m, none, none, var, atoms)[1].isnan()


def test_row_atoms_keep_the_most_recent():
    a, b = _atoms([1.0, 2.0]), _atoms([3.0])
    both = (a + b).last(2)
    assert len(both) == 2 and both.mean[:, 0].tolist() == [2.0, 3.0]
    assert len((a + b).last(0)) == 0 and len(a.last(5)) == 2  # not the whole tail
