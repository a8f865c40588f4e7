"""The counter-based draws of `acchead.inference.device_random`: exact laws, open intervals, no key reuse."""

from __future__ import annotations

import math

import pytest
import torch

from acchead.inference.device_random import (
    DRAFT,
    NEXT,
    TAU,
    _fmix,
    exponential,
    key_hash,
    race,
    sample_token,
    uniform,
)


def test_mixer_is_a_bijection_that_stays_below_2_63():
    h = torch.arange(0, 1 << 20, dtype=torch.int64) * 4093 + 17  # distinct 32-bit inputs
    out = _fmix(h)
    assert out.unique().numel() == h.numel() and int(out.min()) >= 0 and int(out.max()) < 2**32
    top = torch.tensor([2**32 - 1])
    assert int(_fmix(top)) == _fmix(2**32 - 1)  # the products of the largest input did not overflow


def test_python_int_keys_equal_tensor_keys():
    ints = [key_hash(5, NEXT, n, s) for n, s in ((99, 3), (0, 0), (2**32 - 1, 7))]
    tensors = key_hash(5, NEXT, torch.tensor([99, 0, 2**32 - 1]), torch.tensor([3, 0, 7]))
    assert tensors.tolist() == ints
    assert torch.equal(uniform(ints[0], 64), uniform(tensors[0], 64))


def test_uniforms_are_open_uniform_and_deterministic():
    u = uniform(key_hash(7, DRAFT, 123, 4), 200_000)
    assert u.dtype == torch.float64 and bool((u > 0).all()) and bool((u < 1).all())
    assert torch.equal(u, uniform(key_hash(7, DRAFT, 123, 4), 200_000))
    assert abs(float(u.mean()) - 0.5) < 5 * math.sqrt(1 / 12 / u.numel())
    counts = torch.histc(u.float(), bins=20, min=0, max=1)
    expected = u.numel() / 20
    assert float(((counts - expected) ** 2 / expected).sum()) < 50  # 19 dof: P(chi2 > 50) < 1e-4


def test_draws_under_consecutive_keys_are_uncorrelated():
    """Rows keyed by consecutive round starts (what a decode uses): no correlation between rows."""
    u = uniform(key_hash(0, DRAFT, torch.arange(2000), 1), 512)  # (2000, 512)
    x = (u - 0.5) / math.sqrt(1 / 12)
    lag1 = float((x[1:] * x[:-1]).mean())
    assert abs(lag1) < 5 / math.sqrt(x[1:].numel())
    # Not permutations of one another either: the sorted rows differ.
    assert not torch.equal(u[0].sort().values, u[1].sort().values)


def test_extreme_uniforms_stay_inside_the_open_interval():
    h = torch.tensor([0, 2**32 - 1], dtype=torch.int64)
    u = (h.to(torch.float64) + 0.5) * (2.0**-32)
    assert float(u[0]) > 0 and float(u[1]) < 1 and bool((-torch.log(u) > 0).all())


def test_every_part_of_the_key_changes_the_numbers():
    ref = uniform(key_hash(1, DRAFT, 10, 2), 64)
    for other in (key_hash(2, DRAFT, 10, 2), key_hash(1, TAU, 10, 2), key_hash(1, DRAFT, 11, 2),
                  key_hash(1, DRAFT, 10, 3), key_hash(1 + 2**32, DRAFT, 10, 2)):  # fmt: skip
        assert not bool(torch.isclose(uniform(other, 64), ref).any())


def test_batch_rows_equal_single_draws():
    keys = key_hash(5, NEXT, torch.arange(4), 1)
    p = torch.rand(4, 50, generator=torch.Generator().manual_seed(0))
    assert torch.equal(race(p, keys), torch.stack([race(p[i], key_hash(5, NEXT, i, 1)) for i in range(4)]))


@pytest.mark.parametrize("probs", [[0.5, 0.3, 0.2, 0.0], [0.0, 1.0, 0.0, 0.0], [0.1] * 10])
def test_race_draws_the_categorical_and_never_a_zero_weight(probs):
    p = torch.tensor(probs, dtype=torch.float64)
    n = 20_000
    draws = race(p.expand(n, -1), key_hash(3, DRAFT, torch.arange(n), 0))  # one key per row
    counts = torch.bincount(draws, minlength=len(probs)).double()
    assert bool((counts[p == 0] == 0).all())
    expected = p * n
    keep = expected > 0
    chi2 = float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())
    dof = int(keep.sum()) - 1
    assert chi2 < dof + 6 * math.sqrt(2 * max(dof, 1)) + 10


def test_race_accepts_unnormalised_float32_weights():
    w = torch.tensor([2.0, 0.0, 6.0])
    draws = race(w.expand(8000, -1), key_hash(0, TAU, torch.arange(8000), 0))
    share = float((draws == 2).double().mean())
    assert abs(share - 0.75) < 0.03 and not bool((draws == 1).any())


def test_greedy_takes_the_first_maximum_without_a_draw():
    p = torch.tensor([0.1, 0.4, 0.4, 0.1])
    assert int(sample_token(p, True, key_hash(0, DRAFT, 0, 0))) == 1


def test_exponentials_are_positive_with_unit_mean():
    e = exponential(key_hash(11, NEXT, 5, 0), 100_000)
    assert bool((e > 0).all()) and bool(torch.isfinite(e).all())
    assert abs(float(e.mean()) - 1) < 5 / math.sqrt(e.numel())


@pytest.mark.parametrize("verifier", ["token", "block"])
def test_a_seed_fixes_a_sampled_decode_on_every_path(tiny_llama_pair, verifier):
    """Counter-based draws: repeats of a seed give the same tokens, and the eager path (DynamicCache) and
    the static-cache path give the same tokens; another seed gives other tokens."""
    from acchead.inference import SpeculativeDecoder

    target, draft = tiny_llama_pair
    prompt = torch.tensor([3, 7, 11, 5])
    outs = {}
    for fast in (False, True):
        dec = SpeculativeDecoder(target, draft, policy="specdec:k=3", verifier=verifier, fast=fast,
                                 compile=False)  # fmt: skip
        runs = [dec.generate(prompt, max_new_tokens=20, temperature=1.0, seed=4).new_ids for _ in range(3)]
        assert all(torch.equal(r, runs[0]) for r in runs)
        outs[fast] = runs[0]
        other = dec.generate(prompt, max_new_tokens=20, temperature=1.0, seed=5).new_ids
        assert not torch.equal(other, runs[0])
    assert torch.equal(outs[False], outs[True])
