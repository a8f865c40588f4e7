"""The round gate's counterfactual (`acchead.inference.cap_counterfactual`): stretches of drafted positions
by hand, and, against an exact simulation of capped rounds over a known stream of flags, the two readings
bracket it."""

from __future__ import annotations

import random

import pytest
import torch

from acchead.inference.cap_counterfactual import row_tallies, stretch_tallies, stretches

KS = torch.arange(1, 5, dtype=torch.float64)


def test_stretches_by_hand():
    """Rounds (τ, d, cap): 2 of 3 accepted (a rejection), 3 of 3 (bonus flag unseen), 0 of 2, 1 of 1
    (unseen) at the end. Read as 0 every round ends a stretch; read as 1 the unseen ones run on, and a
    change of cap ends a stretch either way."""
    rounds = [(2, 3, 4), (3, 3, 4), (0, 2, 4), (1, 1, 4)]
    assert stretches(rounds, merge=False) == [(3, 4), (4, 4), (1, 4), (2, 4)]
    assert stretches(rounds, merge=True) == [(3, 4), (5, 4), (2, 4)]
    assert stretches([(1, 1, 4), (1, 2, 2)], merge=True) == [(2, 4), (2, 2)]


def test_stretch_tallies_by_hand():
    """A stretch of 5 positions: cap 1 takes 3 rounds (2, 2, 1 tokens), cap 2 two (3, 2), cap 3 two (4, 1),
    cap 4 one (5); a stretch priced only up to cap 2 counts nothing above."""
    rounds, tokens, squares = stretch_tallies(torch.tensor([5, 5]), torch.tensor([4, 2]), KS)
    assert rounds.tolist() == [[3, 2, 2, 1], [3, 2, 0, 0]]
    assert tokens.tolist() == [[5, 5, 5, 5], [5, 5, 0, 0]]
    assert squares.tolist() == [[9, 13, 17, 25], [9, 13, 0, 0]]


def _capped_rounds(flags: list[int], k: int) -> int:
    """Rounds of cap k over a stream of flags: a round accepts the run of 1s from its start, up to k, and
    takes the next position too (the target's token)."""
    start = rounds = 0
    while start < len(flags):
        run = 0
        while run < k and start + run < len(flags) and flags[start + run]:
            run += 1
        start, rounds = start + run + 1, rounds + 1
    return rounds


def _open_rounds(flags: list[int], drafts: list[int]) -> list[tuple[int, int, int]]:
    """The (τ, d, cap 4) of rounds drafting `drafts[i]` candidates each over the stream (as a head would)."""
    out, start, i = [], 0, 0
    while start < len(flags):
        d = min(drafts[i % len(drafts)], len(flags) - start - 1)
        tau = 0
        while tau < d and flags[start + tau]:
            tau += 1
        out.append((tau, d, 4))
        start, i = start + tau + 1, i + 1
    return out


@pytest.mark.parametrize("seed", range(6))
def test_the_readings_bracket_the_rounds_capped_decoding_takes(seed):
    """A stream of flags (acceptance 0.75), open rounds of 1-4 candidates over it: under every cap k the
    rounds read with unseen flags as 0 are at least, and read as 1 at most, those an exact simulation of
    cap k's rounds over the whole stream takes (a 0 ends a round under every cap, and ⌈(a + b) / (k + 1)⌉
    <= ⌈a / (k + 1)⌉ + ⌈b / (k + 1)⌉), and the mixture lies between them."""
    rng = random.Random(seed)
    flags = [int(rng.random() < 0.75) for _ in range(200)]
    rounds = _open_rounds(flags, [rng.randint(1, 4) for _ in range(50)])
    n0 = stretch_tallies(*_stretch_tensors(stretches(rounds, merge=False)), KS)[0].sum(0)
    n1 = stretch_tallies(*_stretch_tensors(stretches(rounds, merge=True)), KS)[0].sum(0)
    mix = row_tallies([rounds], KS)[0][0]
    for k in range(1, 5):
        true = _capped_rounds(flags, k)
        assert n1[k - 1] <= true <= n0[k - 1], (k, float(n1[k - 1]), true, float(n0[k - 1]))
        assert n1[k - 1] - 1e-9 <= mix[k - 1] <= n0[k - 1] + 1e-9


def _stretch_tensors(parts: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor([x for x, _ in parts]), torch.tensor([c for _, c in parts])
