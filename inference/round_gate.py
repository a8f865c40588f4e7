"""The round gate of batched SpecDec++: before a round, decide whether the batch drafts at all.

Why. The batch stop rule (`acchead.inference.batch_stop`) prices each further draft step of a round, but
every round drafts its first candidate, and it values a row's accepted token at t_round(B) / B, what batched
autoregressive decoding pays for it. In lockstep that overvalues drafting: a batch runs until its slowest
row is done, so a token accepted on a row that is not the slowest shortens nothing, and a drafting round
costs more than an autoregressive one (on a CPU the verification's second position is compute). On the
real pair (docs/results/batched-smollm2-eager) batched AR beat every speculative decoder from B = 4 on.

The rule. With m_b tokens left to row b (its max new tokens less those it has), autoregressive rounds finish
the batch in N_AR = max_b m_b rounds. Drafting rounds advance row b by g tokens a round (1 + its accepted
candidates), mean μ_b and variance v; as a sum of rounds, row b needs about m_b / μ_b rounds with standard
deviation σ_b = √(m_b·v / μ_b³) (renewal theory), and the batch the slowest row's:

    N_spec ≈ max_b (m_b / μ_b + e_R·σ_b),    e_R = E[max of R standard normals] ≈ Φ⁻¹((R − ⅜) / (R + ¼))

over the R rows decoding. A drafting round costs ρ autoregressive rounds (`BatchStop.round_ratio`: 1 + c₁(R)
+ (d − 1)·c(R) with d the draft forwards of this decode's drafting rounds so far, from the measured costs of
`acchead.inference.batch_cost`). The batch drafts while ρ·N_spec < N_AR; once it does not, it decodes the
rest of the batch autoregressively (the draft's cache is left behind: resuming would feed it every token
since, and on the fast path compile a feed of that width).

The estimates read only the rounds decoded so far: μ_b shrinks row b's own mean gain towards the pooled one
by `prior_rounds` pseudo-rounds, v is the pooled variance, d the pooled draft forwards. The gate decides
only after `min_rounds` drafting rounds (before them the batch drafts). Like the stop rules it reads the
past only, never the target's distribution of the round it decides, so every row stays an exact sample of
the target (BanditSpec Prop. 3.1; tests/test_round_gate.py).

Left out: rows that end early at EOS (m_b counts to the max new tokens), and that a narrower batch is cheaper
(eager rows leave the batch as they finish, on both kinds of rounds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist

from acchead.errors import AccheadError
from acchead.inference.batch_stop import BatchStop
from acchead.inference.batched_rows import Row


def expected_max_normal(n: int) -> float:
    """E[max of n iid standard normals] by Blom's approximation: 0 at n = 1, 1.05 at 4 (exactly 1.03), 1.77 at
    16 (1.77), 2.34 at 64 (2.42)."""
    if n < 1:
        raise AccheadError(f"need n >= 1 rows, got {n}")
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25)) if n > 1 else 0.0


@dataclass(frozen=True)
class GateEstimate:
    """What the gate weighed before a round: rounds left autoregressively, by drafting, and a drafting
    round's price in autoregressive rounds."""

    ar_rounds: float  # N_AR = max_b m_b
    spec_rounds: float  # N_spec (module docstring)
    ratio: float  # ρ

    @property
    def draft(self) -> bool:
        return self.ratio * self.spec_rounds < self.ar_rounds


@dataclass
class RoundGate:
    """One decode's round gate (module docstring): `draft(rows, active)` before each round, `ran` after it.

    Args:
        rule: the batch rule whose costs price a drafting round (`BatchStop.round_ratio`).
        min_rounds: drafting rounds before the gate decides (>= 1).
        prior_rounds: pseudo-rounds of the pooled mean gain in each row's own (>= 0).
    """

    rule: BatchStop
    min_rounds: int = 2
    prior_rounds: float = 2.0
    closed: bool = False  # the batch decodes the rest autoregressively
    forwards: list[int] = field(default_factory=list)  # the draft forwards of each drafting round
    last: GateEstimate | None = None

    def __post_init__(self) -> None:
        if self.min_rounds < 1 or self.prior_rounds < 0:
            raise AccheadError(f"the round gate needs min_rounds >= 1 and prior_rounds >= 0, got "
                               f"{self.min_rounds}, {self.prior_rounds}")  # fmt: skip

    def ran(self, forwards: int) -> bool:
        """A round ran `forwards` batched draft forwards (its rows' gains are in their results); whether the
        gate is closed (the round was autoregressive by the gate's choice)."""
        if forwards > 0:
            self.forwards.append(forwards)
        return self.closed

    def draft(self, rows: list[Row], active: list[Row]) -> bool:
        """Whether the next round drafts: `rows` every row of the decode (their gains so far), `active` the
        rows still decoding. Once False, False for the rest of the decode."""
        if self.closed:
            return False
        if len(self.forwards) < self.min_rounds:
            return True
        self.last = self.estimate(rows, active)
        self.closed = self.last is not None and not self.last.draft
        return not self.closed

    def estimate(self, rows: list[Row], active: list[Row]) -> GateEstimate | None:
        """N_AR, N_spec and ρ from the rows' drafting rounds so far (module docstring); None before any row
        verified a candidate (caps of 0: nothing to weigh)."""
        gains = [[1 + tau for tau, n in zip(r.res.accepted_per_round, r.res.drafted_per_round, strict=True)
                  if n > 0] for r in rows]  # fmt: skip
        pooled = [g for row in gains for g in row]
        if not pooled:
            return None
        mean = sum(pooled) / len(pooled)
        var = sum((g - mean) ** 2 for g in pooled) / max(len(pooled) - 1, 1)
        by_row = {id(r): g for r, g in zip(rows, gains, strict=True)}
        e_r = expected_max_normal(len(active))
        spec, left = 0.0, []
        for r in active:
            m = r.max_new - r.generated
            own = by_row[id(r)]
            mu = (sum(own) + self.prior_rounds * mean) / (len(own) + self.prior_rounds)
            spec = max(spec, m / mu + e_r * math.sqrt(m * var / mu**3))
            left.append(m)
        ratio = self.rule.round_ratio(len(active), sum(self.forwards) / len(self.forwards))
        return GateEstimate(float(max(left)), spec, ratio)
