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
+ (d − 1)·c(R) with d the draft forwards per drafting round so far, from the measured costs of
`acchead.inference.batch_cost`). The batch drafts while ρ·N_spec < N_AR; once it does not, it decodes the
rest of the batch autoregressively (the draft's cache is left behind: resuming would feed it every token
since, and on the fast path compile a feed of that width).

The estimates read only rounds decoded before: μ_b shrinks row b's own mean gain towards the pooled one by
`prior_rounds` pseudo-rounds, v is the pooled variance, d the pooled draft forwards, pooled over this decode
and the decoder's earlier ones (`GateMemory`: their tallies halved per drafting decode, so a gate may close
before its first round when the pair's acceptance at this cost says so; every 8th decode, the first included,
starts from nothing and drafts until it has its own evidence). The gate weighs once there are
`min_observations` rows' rounds with candidates (before, the batch drafts). Like the stop rules it reads the
past only, never the target's distribution of the round it decides, so every row stays an exact sample of
the target (BanditSpec Prop. 3.1; tests/test_round_gate.py); a decoder's outputs then depend on its earlier
decodes, as a measured c(B) makes them depend on timings.

Left out: rows that end early at EOS (m_b counts to the max new tokens), and that a narrower batch is cheaper
(eager rows leave the batch as they finish, on both kinds of rounds).
"""

from __future__ import annotations

import math
from dataclasses import astuple, dataclass, field
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


@dataclass(frozen=True)
class GateStats:
    """Tallies of drafting rounds: `n` rows' rounds with candidates, the sums of their gains (1 + τ) and
    squared gains; `rounds` drafting rounds and their batched draft `forwards`. Additive (`+`); `scaled`
    weighs an older decode's down."""

    n: float = 0.0
    gain: float = 0.0
    gain2: float = 0.0
    rounds: float = 0.0
    forwards: float = 0.0

    def __add__(self, other: GateStats) -> GateStats:
        return GateStats(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))

    def scaled(self, weight: float) -> GateStats:
        return GateStats(*(weight * a for a in astuple(self)))

    @property
    def mean(self) -> float:
        return self.gain / self.n

    @property
    def var(self) -> float:
        """The gains' variance (n − 1 in the denominator, at least 1)."""
        return max(self.gain2 - self.n * self.mean**2, 0.0) / max(self.n - 1.0, 1.0)


def row_gains(row: Row) -> list[int]:
    """A row's gains (1 + τ) in the rounds it verified candidates."""
    res = row.res
    return [1 + tau for tau, n in zip(res.accepted_per_round, res.drafted_per_round, strict=True) if n > 0]


@dataclass
class RoundGate:
    """One decode's round gate (module docstring): `draft(rows, active)` before each round, `ran` after it.

    Args:
        rule: the batch rule whose costs price a drafting round (`BatchStop.round_ratio`).
        prior: tallies of earlier decodes (`GateMemory`), pooled with this decode's.
        min_observations: rows' rounds with candidates, prior and own, before the gate weighs (>= 1).
        prior_rounds: pseudo-rounds of the pooled mean gain in each row's own (>= 0).
    """

    rule: BatchStop
    prior: GateStats = field(default_factory=GateStats)
    min_observations: float = 8.0
    prior_rounds: float = 2.0
    closed: bool = False  # the batch decodes the rest autoregressively
    forwards: list[int] = field(default_factory=list)  # the draft forwards of each drafting round
    last: GateEstimate | None = None

    def __post_init__(self) -> None:
        if self.min_observations < 1 or self.prior_rounds < 0:
            raise AccheadError(f"the round gate needs min_observations >= 1 and prior_rounds >= 0, got "
                               f"{self.min_observations}, {self.prior_rounds}")  # fmt: skip

    def ran(self, forwards: int) -> bool:
        """A round ran `forwards` batched draft forwards (its rows' gains are in their results); whether the
        gate is closed (the round was autoregressive by the gate's choice)."""
        if forwards > 0:
            self.forwards.append(forwards)
        return self.closed

    def stats(self, rows: list[Row]) -> GateStats:
        """This decode's own tallies: `rows` every row of the decode."""
        gains = [g for r in rows for g in row_gains(r)]
        squares = sum(g * g for g in gains)
        return GateStats(len(gains), sum(gains), squares, len(self.forwards), sum(self.forwards))

    def draft(self, rows: list[Row], active: list[Row]) -> bool:
        """Whether the next round drafts: `rows` every row of the decode (their gains so far), `active` the
        rows still decoding. Once False, False for the rest of the decode."""
        if self.closed:
            return False
        self.last = self.estimate(rows, active)
        self.closed = self.last is not None and not self.last.draft
        return not self.closed

    def estimate(self, rows: list[Row], active: list[Row]) -> GateEstimate | None:
        """N_AR, N_spec and ρ from the drafting rounds so far, the prior's and the rows' (module docstring);
        None before `min_observations` of them (then the batch drafts)."""
        pooled = self.prior + self.stats(rows)
        if pooled.n < self.min_observations or pooled.rounds == 0:
            return None
        e_r = expected_max_normal(len(active))
        spec, left = 0.0, []
        for r in active:
            m, own = r.max_new - r.generated, row_gains(r)
            mu = (sum(own) + self.prior_rounds * pooled.mean) / (len(own) + self.prior_rounds)
            spec = max(spec, m / mu + e_r * math.sqrt(m * pooled.var / mu**3))
            left.append(m)
        ratio = self.rule.round_ratio(len(active), pooled.forwards / pooled.rounds)
        return GateEstimate(float(max(left)), spec, ratio)


@dataclass
class GateMemory:
    """A decoder's round gates across its decodes: each gate starts from the tallies of the decodes before
    (halved per drafting decode, so the recent ones weigh most), and every `explore_every`-th decode (the
    first included) starts from nothing, so a gate that closed on old evidence still sees the pair anew."""

    explore_every: int = 8
    min_observations: float = 8.0  # each gate's (`RoundGate`)
    history: GateStats = field(default_factory=GateStats)
    decodes: int = 0

    def start(self, rule: BatchStop | None) -> RoundGate | None:
        """The next decode's gate under `rule` (None: the rule has no gate)."""
        if rule is None or not rule.gate:
            return None
        explore = self.decodes % self.explore_every == 0
        self.decodes += 1
        return RoundGate(rule, GateStats() if explore else self.history, self.min_observations)

    def remember(self, gate: RoundGate, rows: list[Row]) -> None:
        """After a decode: its own tallies, if it drafted, join the history (the older ones halved)."""
        own = gate.stats(rows)
        if own.n > 0:
            self.history = self.history.scaled(0.5) + own
