"""What a row's drafting rounds would have gained under a smaller cap: the round gate's counterfactual
(`acchead.inference.round_gate`).

Greedy verification decides each drafted position by a flag: the draft's token is the target's (1) or not
(0), fixed by the position's prefix, so the same under every cap. A round that drafted d candidates and had
τ accepted read τ ones, then a 0 at position τ + 1 if τ < d (the target's correction), or, if τ = d, a bonus
position whose flag it never saw. A 0 ends a round under every cap, so a stretch of L positions ending in a
0 takes ⌈L / (k + 1)⌉ rounds under cap k: ⌊L / (k + 1)⌋ of k + 1 tokens and one of the rest. Where a
round accepted all it drafted, the unseen flag is read both ways: as 0 its stretch ends there (L = τ + 1),
as 1 it runs on into the next round's. The tallies are the mixture of the two readings, the second weighted
by α, the acceptance rate of the candidates whose verdict is known. A stretch does not cross a change of cap
(a round capped at c prices the caps up to c).

Measured (a probe on the toy pair's 64 HumanEval prompts, greedy, 64 tokens; the rows' mean rounds): from
fixed K = 6's rounds the two readings put caps 1 / 2 / 3 at 39.1 / 28.6 / 23.4 (as 0) and 37.4 / 26.1 / 22.5
(as 1), their mixture (α = 0.75) at 37.8 / 26.7 / 22.8, against the 37.5 / 26.2 / 22.6 that fixed K = 1 / 2 /
3 took, and the mixture's slowest rows at 45.5 / 37.5 / 35.2 against 45 / 37 / 35. Until the thirty-eighth
session the gate read a round as g_k = 1 + min(τ, k), its first k verdicts alone: 35.9 / 26.4 / 23.0, a cap of
1 priced 4% better than it ran and caps 2-3 1-2% worse, which is why a cold decoder at B = 4 chose cap 1 from
its first 8 rounds.

Under sampling a flag is not fixed by position (a bonus token is the target's sample, not the draft's
token), so the readings are approximations there, as the earlier one was.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def stretches(rounds: Sequence[tuple[int, int, int]], merge: bool) -> list[tuple[int, int]]:
    """(length, cap) of each stretch of one row's drafting rounds, given in order as (τ, d, cap): a round
    ends its stretch at a rejection (τ < d), and at an unseen bonus flag too unless `merge` (read as 1)."""
    out: list[tuple[int, int]] = []
    length, cap = 0, 0
    for tau, drafted, c in rounds:
        if length and c != cap:  # a change of cap ends the stretch
            out.append((length, cap))
            length = 0
        length, cap = length + tau + 1, c
        if tau < drafted or not merge:
            out.append((length, cap))
            length = 0
    if length:
        out.append((length, cap))
    return out


def stretch_tallies(
    lengths: torch.Tensor, caps: torch.Tensor, ks: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rounds, tokens and sums of squared gains of stretches of `lengths` (S,) under each cap `ks` (K,),
    zero above a stretch's own cap `caps` (S,): (S, K) each."""
    size = ks + 1.0
    length = lengths.double()[:, None]
    full = torch.div(length, size, rounding_mode="floor")  # rounds of k + 1 tokens
    rest = length - full * size
    priced = (ks <= caps.double()[:, None]).double()
    rounds = (full + (rest > 0).double()) * priced
    return rounds, length * priced, (full * size**2 + rest**2) * priced


def row_tallies(
    rows: Sequence[Sequence[tuple[int, int, int]]], ks: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's counterfactual rounds, tokens and sums of squared gains under every cap, (rows, K) each,
    from its drafting rounds (τ, d, cap): the mixture of the two readings of unseen flags (module
    docstring)."""
    known = sum(t + (t < d) for row in rows for t, d, _ in row)
    alpha = sum(t for row in rows for t, _, _ in row) / max(known, 1)
    out = []
    for merge, weight in ((False, 1.0 - alpha), (True, alpha)):
        parts = [(b, length, cap) for b, row in enumerate(rows) for length, cap in stretches(row, merge)]
        at = torch.tensor([b for b, _, _ in parts], dtype=torch.long)
        lengths, caps = torch.tensor([x for _, x, _ in parts]), torch.tensor([c for *_, c in parts])
        tallies = stretch_tallies(lengths, caps, ks)
        out.append([weight * torch.zeros(len(rows), len(ks), dtype=torch.float64).index_add_(0, at, t)
                    for t in tallies])  # fmt: skip
    return tuple(a + b for a, b in zip(*out, strict=True))  # type: ignore[return-value]
