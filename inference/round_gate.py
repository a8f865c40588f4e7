"""The round gate of batched SpecDec++: before a round, choose its candidate cap, from 0 (autoregressive) to
the policy's own.

Why. The batch stop rule (`acchead.inference.batch_stop`) prices each further draft step of a round, but
every round drafts its first candidate, and it values a row's accepted token at t_round(B) / B, what batched
autoregressive decoding pays for it. In lockstep that overvalues drafting: a batch runs until its slowest
row is done, so a token accepted on a row that is not the slowest shortens nothing, and a drafting round
costs more than an autoregressive one (on a CPU the verification's second position is compute). On the
real pair (docs/results/batched-smollm2-eager) batched AR beat every speculative decoder from B = 4 on.

The rule. With m_b tokens left to row b (its max new tokens less those it has), autoregressive rounds finish
the batch in N_AR = max_b m_b rounds. Rounds capped at k candidates advance row b by g_k tokens a round, mean
μ_{b,k} and variance v_k; as a sum of rounds, row b needs about m_b / μ_{b,k} rounds with standard deviation
σ_{b,k} = √(m_b·v_k / μ_{b,k}³) (renewal theory), and the batch the slowest row's:

    N_k ≈ max_b (m_b / μ_{b,k} + e_R·σ_{b,k}),    e_R = E[max of R standard normals] ≈ Φ⁻¹((R − ⅜) / (R + ¼))

over the R rows decoding. Such a round costs ρ_k autoregressive rounds (`BatchStop.round_ratio`: the
calibration's timed rounds of d_k draft forwards, d_k the cap's mean, over its autoregressive round;
`acchead.inference.batch_cost`), and a decode whose draft has not read its prompts yet pays their prefill P
(in autoregressive rounds, at the rate of the draft's timed catch-ups) on its first drafting round. The gate
picks the cap with the least ρ_k·N_k + P (N_AR for k = 0; P = 0 once a round drafted). One set of rounds gives
every cap's gains: a row's open round (drafted under the policy's own cap K) with τ of its candidates accepted
would have gained g_k = 1 + min(τ, k) under cap k, since its first k draws are the same (keyed by position)
and so are their verdicts, and its d draft forwards would have been min(d, k). While K is the cheapest the
rounds stay open (the policy's caps, weighed again next round); a smaller cap is kept for the rest of the
decode, since capped rounds say nothing of larger caps. At 0 the draft's cache is left behind (resuming would
feed it every token since, and on the fast path compile a feed of that width) and the verifications stop
collecting a feature draft's states.

The estimates read only rounds decoded before, pooled over this decode and the decoder's earlier ones
(`GateMemory`: their tallies halved per drafting decode, so a gate may choose before its first round; the
first decode, and later ones up to an eighth of the rows decoded, start from nothing and draft open rounds
until they have their own evidence).
v_k and d_k are pooled; so is how much the rows' own mean gains differ beyond their rounds' noise (the
between-row variance t_k: the variance of the row means less v_k over a row's mean rounds). μ_{b,k} is row
b's own mean shrunk towards the pooled one, which weighs as v_k / t_k rounds (normal-normal; `prior_rounds`
where the rows do not differ measurably), and the doubt left in it, v_k / (n_b + v_k / t_k) after n_b
rounds, adds m_b²·doubt / μ_{b,k}⁴ to σ_{b,k}²: before a row's own rounds the gate knows only that rows
differ, and the slowest row of R sets the batch's time. The gate weighs once there are `min_observations`
rows' open rounds with candidates. Like the stop rules it reads the past only, never the target's
distribution of the round it decides, so every row stays an exact sample of the target (BanditSpec Prop. 3.1;
tests/test_round_gate.py); a decoder's outputs then depend on its earlier decodes, as a measured c(B) makes
them depend on timings.

Left out: rows that end early at EOS (m_b counts to the max new tokens), that a narrower batch is cheaper
(eager rows leave the batch as they finish, under every cap), and block verification's τ under a smaller
cap (taken as min(τ, k), which token verification gives exactly).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from statistics import NormalDist

import torch

from acchead.errors import AccheadError
from acchead.inference.batch_stop import BatchStop
from acchead.inference.batched_feed import TokenFeed
from acchead.inference.batched_rows import Row


def expected_max_normal(n: int) -> float:
    """E[max of n iid standard normals] by Blom's approximation: 0 at n = 1, 1.05 at 4 (exactly 1.03), 1.77 at
    16 (1.77), 2.34 at 64 (2.42)."""
    if n < 1:
        raise AccheadError(f"need n >= 1 rows, got {n}")
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25)) if n > 1 else 0.0


@dataclass(frozen=True)
class GateStats:
    """Tallies of open drafting rounds (the policy's own caps), counted for every cap k = 1..K at once: a
    row's round that drafted n > 0 candidates and had τ accepted would have gained g_k = 1 + min(τ, k) tokens
    under cap k (the same draws, keyed by position; the same verdicts on the first k). `n` rows' rounds,
    `gain` and `gain2` (K,) sums of g_k and g_k², `rounds` drafting rounds and `forwards` (K,) sums of
    min(d, k) for a round's d batched draft forwards; `rows` rows, `row_mean` and `row_mean2` (K,) sums of
    each row's mean gain and its square (how much rows differ). Additive (`+`); `scaled` weighs an older
    decode's down."""

    n: float = 0.0
    gain: torch.Tensor | None = None  # (K,) float64; None: no rounds yet
    gain2: torch.Tensor | None = None
    rounds: float = 0.0
    forwards: torch.Tensor | None = None
    rows: float = 0.0
    row_mean: torch.Tensor | None = None
    row_mean2: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.gain is not None:  # tallies of rounds alone: no row means yet
            for name in ("row_mean", "row_mean2"):
                if getattr(self, name) is None:
                    object.__setattr__(self, name, torch.zeros_like(self.gain))

    def __add__(self, other: GateStats) -> GateStats:
        if self.gain is None or other.gain is None:
            return other if self.gain is None else self
        return GateStats(*(a + b for a, b in zip(self._values(), other._values(), strict=True)))

    def scaled(self, weight: float) -> GateStats:
        return self if self.gain is None else GateStats(*(weight * a for a in self._values()))

    def _values(self) -> tuple:
        return tuple(getattr(self, f.name) for f in fields(self))

    @property
    def mean(self) -> torch.Tensor:
        """(K,) the mean gain under each cap."""
        assert self.gain is not None
        return self.gain / self.n

    @property
    def var(self) -> torch.Tensor:
        """(K,) the gains' variance under each cap (n − 1 in the denominator, at least 1)."""
        assert self.gain2 is not None
        return (self.gain2 - self.n * self.mean**2).clamp_min(0.0) / max(self.n - 1.0, 1.0)

    @property
    def between(self) -> torch.Tensor:
        """(K,) how much the rows' own mean gains differ beyond their rounds' noise: the variance of the row
        means less the pooled variance over a row's mean rounds (0 from fewer than two rows)."""
        if self.rows < 2:
            return torch.zeros_like(self.mean)
        assert self.row_mean is not None and self.row_mean2 is not None
        spread = (self.row_mean2 - self.row_mean**2 / self.rows) / (self.rows - 1.0)
        return (spread - self.var * self.rows / self.n).clamp_min(0.0)


@dataclass(frozen=True)
class GateEstimate:
    """What the gate weighed before a round: `costs[k]` the rounds, in autoregressive rounds' time, left
    to the batch under cap k (k = 0: autoregressive, N_AR; k >= 1: ρ_k·N_k)."""

    costs: tuple[float, ...]

    @property
    def choice(self) -> int:
        """The cheapest cap (ties to the larger: a cap above every round's drafts changes nothing)."""
        return min(range(len(self.costs)), key=lambda k: (self.costs[k], -k))


@dataclass
class RoundGate:
    """One decode's round gate (module docstring): `cap(active)` before each round, `ran` after it.

    Args:
        rule: the batch rule whose costs price a drafting round (`BatchStop.round_ratio`).
        max_cap: K, the policy's candidate cap (>= 1).
        prior: tallies of earlier decodes (`GateMemory`), pooled with this decode's.
        min_observations: rows' rounds with candidates, prior and own, before the gate weighs (>= 1).
        prior_rounds: pseudo-rounds of the pooled mean gain in each row's own (>= 0).
        prefill: the draft's prefill of this decode's prompts, in autoregressive rounds (>= 0): its first
            drafting round pays it, so until then every cap above 0 costs it more (`draft_prefill_rounds`).
    """

    rule: BatchStop
    max_cap: int
    prior: GateStats = field(default_factory=GateStats)
    min_observations: float = 32.0
    prior_rounds: float = 2.0
    prefill: float = 0.0
    choice: int | None = None  # None: open (the policy's caps); 0: autoregressive; k: at most k candidates
    own: GateStats = field(default_factory=GateStats)
    last: GateEstimate | None = None

    def __post_init__(self) -> None:
        if self.min_observations < 1 or self.prior_rounds < 0 or self.max_cap < 1 or self.prefill < 0:
            raise AccheadError("the round gate needs min_observations >= 1, prior_rounds >= 0, a cap >= 1 and"
                               f" prefill >= 0, got {self.min_observations}, {self.prior_rounds},"
                               f" {self.max_cap}, {self.prefill}")
        self._ks = torch.arange(1, self.max_cap + 1, dtype=torch.float64)  # (K,) the caps k
        self._rows: dict[int, tuple[float, torch.Tensor]] = {}  # id(row) -> its rounds, its (K,) gain sums

    @property
    def closed(self) -> bool:
        """The batch decodes the rest autoregressively."""
        return self.choice == 0

    def ran(self, forwards: int, rows: list[Row]) -> None:
        """After a round of `rows` that ran `forwards` batched draft forwards: an open round's verdicts join
        the tallies."""
        if forwards > 0:  # the draft holds the prompts now
            self.prefill = 0.0
        if self.choice is None and forwards > 0:
            verdicts = [(r, r.res.accepted_per_round[-1]) for r in rows if r.res.drafted_per_round[-1] > 0]
            if verdicts:
                tau = torch.tensor([t for _, t in verdicts], dtype=torch.float64)
                gains = 1.0 + torch.minimum(tau[:, None], self._ks)  # (R, K) g_k of each row
                for (r, _), g in zip(verdicts, gains, strict=True):
                    n, total = self._rows.get(id(r), (0.0, torch.zeros_like(self._ks)))
                    self._rows[id(r)] = (n + 1.0, total + g)
                fwd = torch.minimum(torch.tensor(float(forwards), dtype=torch.float64), self._ks)
                self.own = self.own + GateStats(len(verdicts), gains.sum(0), (gains**2).sum(0), 1.0, fwd)

    def cap(self, active: list[Row]) -> int:
        """The next round's candidate cap for the `active` rows: K while open (then the policy's own caps),
        0 for an autoregressive round, or the cap the gate chose (kept for the rest of the decode)."""
        if self.choice is not None:
            return self.choice
        self.last = self.estimate(active)
        if self.last is not None and self.last.choice < self.max_cap:
            self.choice = self.last.choice
            return self.choice
        return self.max_cap

    def tallies(self) -> GateStats:
        """This decode's own tallies, its rows' mean gains included."""
        if self.own.gain is None:
            return self.own
        means = torch.stack([total / n for n, total in self._rows.values()])  # (rows, K)
        return replace(self.own, rows=float(len(means)), row_mean=means.sum(0), row_mean2=(means**2).sum(0))

    def estimate(self, active: list[Row]) -> GateEstimate | None:
        """The cost of each cap from the open rounds so far, the prior's and this decode's (module
        docstring); None before `min_observations` of them (then the batch drafts on)."""
        pooled = self.prior + self.tallies()
        if pooled.gain is None or pooled.n < self.min_observations:
            return None
        mean, var, between = pooled.mean, pooled.var, pooled.between  # (K,)
        zero = torch.zeros_like(self._ks)
        own = [self._rows.get(id(r), (0.0, zero)) for r in active]
        n = torch.tensor([c for c, _ in own], dtype=torch.float64)[:, None]  # (R, 1)
        # each row's mean gain, its own rounds' mean shrunk towards the pooled one (normal-normal): the
        # pooled one weighs as var / between rounds (`prior_rounds` where the rows do not differ measurably)
        fixed = torch.full_like(var, self.prior_rounds)
        weight = torch.where(between > 0, var / between.clamp_min(1e-12), fixed)
        mu = (torch.stack([t for _, t in own]) + weight * mean) / (n + weight)  # (R, K)
        unsure = var / (n + weight)  # (R, K) the variance left in a row's mean gain
        m = torch.tensor([float(r.max_new - r.generated) for r in active], dtype=torch.float64)[:, None]
        spread = (m * var / mu**3 + m**2 * torch.where(between > 0, unsure, 0.0) / mu**4).sqrt()
        rounds = (m / mu + expected_max_normal(len(active)) * spread).amax(0)  # (K,) N_k
        d = (pooled.forwards / pooled.rounds).tolist()
        ratio = torch.tensor([self.rule.round_ratio(len(active), dk) for dk in d], dtype=torch.float64)
        return GateEstimate((float(m.max()), *(ratio * rounds + self.prefill).tolist()))


@dataclass
class GateMemory:
    """A decoder's round gates across its decodes: each gate starts from the tallies of the decodes before
    (halved per drafting decode, so the recent ones weigh most), and now and then a decode starts from
    nothing (explores), so a gate that closed on old evidence still sees the pair anew.

    Which decodes explore: the first (there is no evidence yet), then one whenever the rows of the decodes
    that explored by choice, this one's included, stay within `explore_share` of all rows decoded, this
    one's included. At a constant batch size that is about every 1 / `explore_share`-th decode; counted in
    rows, not decodes, because an exploring decode's cost (the draft's prefill over every prompt, a drafted
    round) grows with its rows: a batch of 64 after batches of 4 explores only once the small batches' rows
    have paid for it."""

    explore_share: float = 0.125
    min_observations: float = 32.0  # each gate's (`RoundGate`)
    history: GateStats = field(default_factory=GateStats)
    decodes: int = 0
    rows: int = 0  # rows decoded under a gate
    explored: int = 0  # of them, rows of decodes that explored by choice (not the first's)

    def __post_init__(self) -> None:
        if not 0.0 < self.explore_share <= 1.0:
            raise AccheadError(f"the round gate's explore_share must be in (0, 1], got {self.explore_share}")

    def start(
        self, rule: BatchStop | None, head: object, max_cap: int, rows: int = 1, prefill: float = 0.0
    ) -> RoundGate | None:
        """The next decode's gate, of `rows` rows whose draft prefill costs `prefill` autoregressive rounds,
        under `rule` for a policy with SpecDec++'s `head` (None: none) and cap `max_cap`; None where the
        rule has no gate."""
        if rule is None or not rule.gate or head is None or max_cap < 1:
            return None
        # the first decode explores anyway: its history is empty
        chosen = self.history.gain is not None and (
            self.explored + rows <= self.explore_share * (self.rows + rows)
        )  # fmt: skip
        self.decodes, self.rows = self.decodes + 1, self.rows + rows
        self.explored += rows if chosen else 0
        prior = GateStats() if chosen else self.history
        return RoundGate(rule, max_cap, prior, self.min_observations, prefill=prefill)

    def remember(self, gate: RoundGate) -> None:
        """After a decode: its own tallies, if it drafted open rounds, join the history (the older halved)."""
        if gate.own.gain is not None:
            self.history = self.history.scaled(0.5) + gate.tallies()


def draft_prefill_rounds(
    feed: TokenFeed | None, prompt_tokens: int, rule: BatchStop | None, batch: int
) -> float:
    """The draft's prefill of `prompt_tokens` prompt tokens over `batch` rows, in autoregressive rounds: at
    the rate of the `feed`'s catch-ups so far (`TokenFeed.catch_up_s` / `catch_up_tokens`, a decode's first
    being its prefill) over the measured round (`BatchCosts.round_s_at`); 0 before any or unmeasured."""
    if feed is None or not feed.catch_up_tokens or rule is None or rule.costs is None:
        return 0.0
    return feed.catch_up_s / feed.catch_up_tokens * prompt_tokens / rule.costs.round_s_at(batch)
