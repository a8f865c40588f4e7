"""The verifiers' laws on the toy world of `test_exactness.py`: block verification's scan (the last success
wins), its expected acceptance against token verification's, its log-space ρ, and a padded round (the fast
path's fixed widths, the batched decoder's vectorised rows) against its real candidates."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from test_exactness import PROMPT, VERIFIERS, WORLDS, round_outcomes

from acchead.inference import parse_policy
from acchead.inference.verification import (
    block_h,
    block_rho,
    block_tau_probs,
    token_tau_probs,
    verify_block,
    verify_token,
)


def test_block_scan_last_success_wins():
    """P(τ = i) from the formula equals enumerating every success/failure pattern of the η scan."""
    w = WORLDS["V3-len4"]
    tokens = torch.tensor([0, 2, 1])
    ctx = PROMPT
    q = torch.stack([w.q(ctx + tuple(tokens[:i].tolist())) for i in range(3)])
    q = (q + 0.1) / (q + 0.1).sum(-1, keepdim=True)  # every token draftable
    p = torch.stack([w.p(ctx + tuple(tokens[:i].tolist())) for i in range(4)])
    h = block_h(tokens, q, p).tolist()
    expect = [0.0] * 4
    for pattern in itertools.product([False, True], repeat=3):
        prob = math.prod(h[i + 1] if s else 1 - h[i + 1] for i, s in enumerate(pattern))
        expect[max([0] + [i + 1 for i, s in enumerate(pattern) if s])] += prob
    assert torch.allclose(block_tau_probs(tokens, q, p), torch.tensor(expect, dtype=torch.float64))


def test_block_accepts_at_least_as_much_as_token():
    """E[τ] under block verification ≥ under token verification (Sun et al. 2024, Thm 2), drafts ~ q."""
    w = WORLDS["V3-len4"]
    e_block = e_token = 0.0
    for drafted, p_draft, q in round_outcomes(w, parse_policy("specdec:k=3").start_decode(), ()):
        tokens = torch.tensor(drafted)
        p = torch.stack([w.p(PROMPT + drafted[:i]) for i in range(len(drafted) + 1)])
        ranks = torch.arange(len(drafted) + 1, dtype=torch.float64)
        # Not per draft: for a given draft block can accept less; only the expectation is ordered.
        e_block += p_draft * float((block_tau_probs(tokens, q, p) * ranks).sum())
        e_token += p_draft * float((token_tau_probs(tokens, q, p) * ranks).sum())
    assert e_block > e_token + 1e-3


def test_block_rho_log_space_survives_tiny_ratios():
    """ρ is a running product of ratios; in log space 40 ratios of 1e-3 give 1e-120 (float64), not NaN."""
    v = 2
    q = torch.full((40, v), 0.5, dtype=torch.float64)
    p = torch.tensor([[5e-4, 1 - 5e-4]] * 41, dtype=torch.float64)
    rho = block_rho(torch.zeros(40, dtype=torch.long), q, p)
    assert torch.isclose(rho[-1], torch.tensor(1e-120, dtype=torch.float64), rtol=1e-9)
    assert torch.isfinite(block_tau_probs(torch.zeros(40, dtype=torch.long), q, p)).all()


@pytest.mark.parametrize("verifier", ["token", "block"])
def test_padded_round_has_the_laws_and_draws_of_its_real_candidates(verifier):
    """A round padded to a wider verification (`num` real candidates, zero q rows, junk tokens and p rows
    after them: the fast path's one graph per width) has the unpadded round's laws of τ and of the next
    token, and its samplers draw the same (τ, token) under the same keys."""
    tau_probs, next_dist = VERIFIERS[verifier]
    sampler = {"token": verify_token, "block": verify_block}[verifier]
    g = torch.Generator().manual_seed(0)
    v, width = 7, 6
    for trial in range(40):
        num = trial % width  # 0..5 real candidates, padded to 5 slots
        tokens = torch.randint(0, v, (width - 1,), generator=g)
        q = torch.rand(width - 1, v, generator=g, dtype=torch.float64) ** 3
        q = q / q.sum(-1, keepdim=True)
        q[num:] = 0.0
        p = torch.rand(width, v, generator=g, dtype=torch.float64) ** 3
        p = p / p.sum(-1, keepdim=True)
        real = (tokens[:num], q[:num], p[: num + 1])
        law = tau_probs(*real)
        padded = tau_probs(tokens, q, p, torch.tensor(num) if trial % 2 else num)
        assert torch.allclose(padded[: num + 1], law, atol=1e-12) and not padded[num + 1 :].any()
        for tau in range(num + 1):
            args = (tau, num) if verifier == "block" else (tau,)
            assert torch.allclose(next_dist(tokens, q, p, *args), next_dist(*real, tau), atol=1e-12)
        for key in range(5):
            want = sampler(*real, False, 3 * key, 3 * key + 1)
            got = sampler(tokens, q, p, False, 3 * key, 3 * key + 1, torch.tensor(num))
            assert [int(x) for x in got] == [int(x) for x in want]
