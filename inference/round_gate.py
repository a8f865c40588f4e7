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
μ_{b,k} and variance v_k, so row b needs about m_b / μ_{b,k} rounds and the batch N_k, its slowest row's
(`acchead.inference.slowest_row`: from the spread of earlier decodes' rows where the memory holds enough of
them, else a normal model). Such a round costs ρ_k autoregressive rounds (`BatchStop.round_ratio`: the
calibration's timed rounds of d_k draft forwards, d_k the cap's mean, over its autoregressive round;
`acchead.inference.batch_cost`), and a decode whose draft has not read its prompts yet pays their prefill P
(in autoregressive rounds, at the rate of the draft's timed catch-ups) on its first drafting round. The gate
picks the cap with the least ρ_k·N_k + P (N_AR for k = 0; P = 0 once a round drafted). One set of rounds gives
several caps' gains: a row's round with τ of its candidates accepted would have gained g_k = 1 + min(τ, k)
under cap k, since its first k draws are the same (keyed by position) and so are their verdicts, and its d
draft forwards would have been min(d, k); an open round (the policy's own cap K) prices every cap, a round
capped at c those up to c. While K is the cheapest the rounds stay open (the policy's caps, weighed again once
the evidence grew by a quarter, `reweigh`); a smaller cap is kept for the rest of the decode. At 0 the draft's
cache is left behind (resuming would feed it every token since, and on the fast path compile a feed of that
width) and the verifications stop collecting a feature draft's states.

The estimates read only rounds decoded before, pooled over this decode and the decoder's earlier ones
(`GateMemory`: their tallies halved per drafting decode, and their last rows kept as atoms, so a gate may
choose before its first round; the first decode, and later ones up to an eighth of the rows decoded, start
from nothing and draft open rounds until they have their own evidence). v_k and d_k are pooled; so is how
much the rows' own mean gains differ beyond their rounds' noise (the between-row variance t_k). Under the
normal model μ_{b,k} is row b's own mean shrunk towards the pooled one, which weighs as v_k / t_k rounds
(normal-normal; `prior_rounds` where the rows do not differ measurably), and the doubt left in it widens
the row's spread: before a row's own rounds the gate knows only that rows differ, and the slowest row of R
sets the batch's time. The gate weighs once there are `min_observations` rows' rounds with candidates
under cap 1, and never chooses a cap priced by fewer (a few rounds' gains under caps the decodes since did
not run, read alone, picked caps 4-7 where 3 was best on the toy pair at B = 4). Like the stop rules it
reads the past only, never the target's distribution of the round it decides, so every row stays an exact
sample of the target (BanditSpec Prop. 3.1; tests/test_round_gate_decoding.py); a decoder's outputs then
depend on its earlier decodes, as a measured c(B) makes them depend on timings.

Left out: rows that end early at EOS (m_b counts to the max new tokens), that a narrower batch is cheaper
(eager rows leave the batch as they finish, under every cap), and block verification's τ under a smaller
cap (taken as min(τ, k), which token verification gives exactly).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import torch

from acchead.errors import AccheadError
from acchead.inference.batch_stop import BatchStop
from acchead.inference.batched_feed import TokenFeed
from acchead.inference.batched_rows import Row
from acchead.inference.slowest_row import RowAtoms, empirical_rounds, normal_rounds


@dataclass(frozen=True)
class GateStats:
    """Tallies of drafting rounds, counted under every cap k = 1..K they price: a row's round that drafted
    n > 0 candidates and had τ accepted would have gained g_k = 1 + min(τ, k) tokens under cap k (the same
    draws, keyed by position; the same verdicts on the first k), which an open round (the policy's own caps)
    tells for every k and a round capped at c for k <= c. Per cap, (K,) each: `n` rows' rounds, `gain` and
    `gain2` sums of g_k and g_k², `rounds` drafting rounds and `forwards` sums of min(d, k) for a round's d
    batched draft forwards, `rows` rows, `row_mean` and `row_mean2` sums of each row's mean gain and its
    square (how much rows differ). A number given for a count fills every cap. Additive (`+`); `scaled`
    weighs an older decode's down."""

    n: torch.Tensor | float = 0.0
    gain: torch.Tensor | None = None  # (K,) float64; None: no rounds yet
    gain2: torch.Tensor | None = None
    rounds: torch.Tensor | float = 0.0
    forwards: torch.Tensor | None = None
    rows: torch.Tensor | float = 0.0
    row_mean: torch.Tensor | None = None
    row_mean2: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.gain is not None:  # counts as (K,) tensors, row means zero until given
            for f in fields(self):
                value = getattr(self, f.name)
                if value is None or not isinstance(value, torch.Tensor):
                    object.__setattr__(self, f.name, torch.full_like(self.gain, float(value or 0.0)))

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
        """(K,) the mean gain under each cap (1 where no round prices it)."""
        assert self.gain is not None
        return torch.where(self.n > 0, self.gain / self.n.clamp_min(1e-12), 1.0)

    @property
    def var(self) -> torch.Tensor:
        """(K,) the gains' variance under each cap (n − 1 in the denominator, at least 1)."""
        assert self.gain2 is not None
        return (self.gain2 - self.n * self.mean**2).clamp_min(0.0) / (self.n - 1.0).clamp_min(1.0)

    @property
    def between(self) -> torch.Tensor:
        """(K,) how much the rows' own mean gains differ beyond their rounds' noise: the variance of the row
        means less the pooled variance over a row's mean rounds (0 from fewer than two rows)."""
        assert self.row_mean is not None and self.row_mean2 is not None
        rows = self.rows.clamp_min(2.0)
        spread = (self.row_mean2 - self.row_mean**2 / rows) / (rows - 1.0)
        beyond = spread - self.var * rows / self.n.clamp_min(1e-12)
        return torch.where(self.rows >= 2, beyond, 0.0).clamp_min(0.0)


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
        min_observations: rows' rounds with candidates, prior and own, before the gate weighs (>= 1), and
            that a cap must have priced to be chosen.
        prior_rounds: pseudo-rounds of the pooled mean gain in each row's own (>= 0).
        prefill: the draft's prefill of this decode's prompts, in autoregressive rounds (>= 0): its first
            drafting round pays it, so until then every cap above 0 costs it more (`draft_prefill_rounds`).
        atoms: rows of earlier decodes (`GateMemory`): where enough of them priced a cap, the slowest row's
            rounds come from their spread (`empirical_rounds`), else from the normal model.
        reweigh: while open, the gate weighs again once the rounds it has seen grew by this share (> 0) since
            it last weighed: a few times a decode, not every round (a weighing costs ~0.5-7 ms on a CPU
            at K = 20, a toy round at B = 4 ~11 ms).
        open_cap: the cap of the rounds while open, 1..K (None: K): an exploring decode's (`GateMemory`) is
            set from the caps chosen before, so it does not pay the policy's full cap on every row.
    """

    rule: BatchStop
    max_cap: int
    prior: GateStats = field(default_factory=GateStats)
    min_observations: float = 32.0
    prior_rounds: float = 2.0
    prefill: float = 0.0
    atoms: RowAtoms | None = None
    reweigh: float = 0.25
    open_cap: int | None = None
    choice: int | None = None  # None: open (the policy's caps); 0: autoregressive; k: at most k candidates
    last: GateEstimate | None = None

    def __post_init__(self) -> None:
        if self.open_cap is None:
            self.open_cap = self.max_cap
        if (self.min_observations < 1 or self.prior_rounds < 0 or self.max_cap < 1 or self.prefill < 0
                or self.reweigh <= 0 or not 1 <= self.open_cap <= self.max_cap):  # fmt: skip
            raise AccheadError("the round gate needs min_observations >= 1, prior_rounds >= 0, a cap >= 1,"
                               " prefill >= 0, reweigh > 0 and an open cap in 1..the cap, got"
                               f" {self.min_observations}, {self.prior_rounds}, {self.max_cap},"
                               f" {self.prefill}, {self.reweigh}, {self.open_cap}")
        self._weigh_at = self.min_observations  # rounds seen (under cap 1) at which the gate weighs next
        self._ks = torch.arange(1, self.max_cap + 1, dtype=torch.float64)  # (K,) the caps k
        # the drafting rounds as plain numbers (a round costs a list append; tensors are built when the gate
        # weighs): each round's rows (their ids), their τ, its draft forwards, the largest cap it prices
        self._log: list[tuple[list[int], list[int], int, int]] = []
        self._seen = 0  # rows' rounds logged
        self._prior_seen = float(torch.as_tensor(self.prior.n).flatten()[0])
        self._summary: tuple[int, GateStats, dict[int, int], torch.Tensor, torch.Tensor] | None = None

    @property
    def closed(self) -> bool:
        """The batch decodes the rest autoregressively."""
        return self.choice == 0

    def ran(self, forwards: int, rows: list[Row]) -> None:
        """After a round of `rows` that ran `forwards` batched draft forwards: its verdicts join the tallies
        of the caps it prices (every cap for an open round, those up to the cap for a capped one)."""
        if forwards > 0:  # the draft holds the prompts now
            self.prefill = 0.0
        if self.choice == 0 or forwards == 0:
            return
        drafted = [r for r in rows if r.res.drafted_per_round[-1] > 0]
        if drafted:
            taus = [r.res.accepted_per_round[-1] for r in drafted]
            self._log.append(([id(r) for r in drafted], taus, forwards, self.choice or self.open_cap))
            self._seen += len(drafted)

    def cap(self, active: list[Row]) -> int:
        """The next round's candidate cap for the `active` rows: the open cap while open (K: the policy's own
        caps), 0 for an autoregressive round, or the cap the gate chose (kept for the rest of the decode)."""
        assert self.open_cap is not None
        if self.choice is not None:
            return self.choice
        seen = self._seen + self._prior_seen  # rows' rounds under cap 1
        if seen < self._weigh_at:  # open until the evidence has grown enough to weigh (again)
            return self.open_cap
        self._weigh_at = max(seen * (1.0 + self.reweigh), self.min_observations)
        self.last = self.estimate(active)
        if self.last is not None and self.last.choice < self.open_cap:
            self.choice = self.last.choice
            return self.choice
        return self.open_cap

    def _tally(self) -> tuple[GateStats, dict[int, int], torch.Tensor, torch.Tensor]:
        """The logged rounds as tensors: their tallies (without row means), each row's index, and per row
        (rows, K) its rounds and gain sums under each cap; rebuilt only after new rounds."""
        if not self._log:
            empty = torch.zeros(0, self.max_cap, dtype=torch.float64)
            return GateStats(), {}, empty, empty
        if self._summary is None or self._summary[0] != len(self._log):
            index: dict[int, int] = {}
            keys = [index.setdefault(k, len(index)) for ids, *_ in self._log for k in ids]
            caps = [c for ids, _, _, c in self._log for _ in ids]
            tau = torch.tensor([t for _, taus, *_ in self._log for t in taus], dtype=torch.float64)
            priced = (self._ks <= torch.tensor(caps, dtype=torch.float64)[:, None]).double()  # (N, K)
            gains = (1.0 + torch.minimum(tau[:, None], self._ks)) * priced  # (N, K) g_k of each row's round
            per_round = torch.tensor([[f, c] for _, _, f, c in self._log], dtype=torch.float64)  # (rounds, 2)
            round_priced = (self._ks <= per_round[:, 1:]).double()  # (rounds, K)
            fwd = (torch.minimum(per_round[:, :1], self._ks) * round_priced).sum(0)
            own = GateStats(priced.sum(0), gains.sum(0), (gains**2).sum(0), round_priced.sum(0), fwd)
            where = torch.tensor(keys, dtype=torch.long)
            n = torch.zeros(len(index), self.max_cap, dtype=torch.float64).index_add_(0, where, priced)
            total = torch.zeros_like(n).index_add_(0, where, gains)
            self._summary = (len(self._log), own, index, n, total)
        return self._summary[1:]

    @property
    def own(self) -> GateStats:
        """This decode's tallies of its drafting rounds (without row means: `tallies`)."""
        return self._tally()[0]

    def tallies(self) -> GateStats:
        """This decode's own tallies, its rows' mean gains included."""
        own = self.own
        if own.gain is None:
            return own
        atoms = self.row_atoms()  # (rows, K) each
        rows, means = (atoms.n > 0).double().sum(0), atoms.mean
        return replace(own, rows=rows, row_mean=means.sum(0), row_mean2=(means**2).sum(0))

    def row_atoms(self) -> RowAtoms:
        """This decode's rows as atoms (`RowAtoms`) for the decodes after it."""
        _, _, n, total = self._tally()
        return RowAtoms(n, torch.where(n > 0, total / n.clamp_min(1.0), 0.0))

    def estimate(self, active: list[Row]) -> GateEstimate | None:
        """The cost of each cap from the rounds so far, the prior's and this decode's (module docstring); None
        before `min_observations` of them (then the batch drafts on)."""
        pooled = self.prior + self.tallies()
        if pooled.gain is None or float(pooled.n[0]) < self.min_observations:
            return None
        mean, var, between = pooled.mean, pooled.var, pooled.between  # (K,)
        _, index, row_n, row_total = self._tally()
        # (R, K) each active row's own rounds and gain sums under each cap (zeros before its first)
        pad = torch.zeros(1, self.max_cap, dtype=torch.float64)
        at = torch.tensor([index.get(id(r), -1) for r in active], dtype=torch.long)  # -1: none yet
        n, total = torch.cat([row_n, pad])[at], torch.cat([row_total, pad])[at]
        # each row's mean gain, its own rounds' mean shrunk towards the pooled one (normal-normal): the
        # pooled one weighs as var / between rounds (`prior_rounds` where the rows do not differ measurably)
        fixed = torch.full_like(var, self.prior_rounds)
        weight = torch.where(between > 0, var / between.clamp_min(1e-12), fixed)
        mu = (total + weight * mean) / (n + weight)  # (R, K)
        unsure = torch.where(between > 0, var / (n + weight), 0.0)  # (R, K) the variance left in a row's mean
        m = torch.tensor([float(r.max_new - r.generated) for r in active], dtype=torch.float64)[:, None]
        rounds = normal_rounds(m, mu, var, unsure)  # (K,) N_k
        if self.atoms is not None:  # earlier rows' spread where enough of them priced a cap
            own_mean = torch.where(n > 0, total / n.clamp_min(1.0), 0.0)
            row_mean = torch.where(pooled.rows > 0, pooled.row_mean / pooled.rows.clamp_min(1e-12), mean)
            empirical = empirical_rounds(m, n, own_mean, var, self.atoms, row_mean, between)
            rounds = torch.where(empirical.isnan(), rounds, empirical)
        d = (pooled.forwards / pooled.rounds.clamp_min(1e-12)).tolist()
        ratio = torch.tensor([self.rule.round_ratio(len(active), dk) for dk in d], dtype=torch.float64)
        priced = pooled.n >= self.min_observations  # (K,) a cap with fewer rows' rounds is never chosen
        costs = torch.where(priced, ratio * rounds + self.prefill, float("inf"))
        return GateEstimate((float(m.max()), *costs.tolist()))


@dataclass
class GateMemory:
    """A decoder's round gates across its decodes: each gate starts from the tallies of the decodes before
    (halved per drafting decode, so the recent ones weigh most), and now and then a decode starts from
    nothing (explores), so a gate that closed on old evidence still sees the pair anew.

    Which decodes explore: the first (there is no evidence yet), the 2nd, 4th, 8th, ... (the earlier, the
    thinner the evidence: the first decode's few rounds of a few rows chose cap 1 on the toy pair at B = 4
    where 3 was best, and the decodes after it followed), and one whenever the rows of the decodes that
    explored by choice, this one's included, stay within `explore_share` of all rows decoded, this one's
    included. At a constant batch size that is about every 1 / `explore_share`-th decode; counted in rows,
    not decodes, because an exploring decode's cost (the draft's prefill over every prompt, a drafted round)
    grows with its rows: a batch of 64 after batches of 4 explores only once the small batches' rows have
    paid for it. An exploring decode starts without the atoms (`RoundGate.atoms`) too, and its open
    rounds are capped at 2c + 1 (at least 2, at most K) for the cap c the latest decode ran (its open
    cap where it stayed open): a batch drafts until its last row stops, so open rounds at K = 20 ran ~10
    draft forwards each on the toy pair at B = 4 where the chosen cap was 3 (an exploring decode cost ~1.5x
    a capped one); a cap past 2c + 1 is reached over later explorations, each reaching twice as far."""

    explore_share: float = 0.125
    min_observations: float = 32.0  # each gate's (`RoundGate`)
    row_memory: int = 256  # the most recent rows kept as atoms
    history: GateStats = field(default_factory=GateStats)
    atoms: RowAtoms | None = None
    decodes: int = 0
    rows: int = 0  # rows decoded under a gate
    explored: int = 0  # of them, rows of decodes that explored by choice (not the first's)
    last_cap: int | None = None  # the cap the latest decode ran (its choice, or its open cap)

    def __post_init__(self) -> None:
        if not 0.0 < self.explore_share <= 1.0:
            raise AccheadError(f"the round gate's explore_share must be in (0, 1], got {self.explore_share}")
        if self.row_memory < 1:
            raise AccheadError(f"the round gate's row_memory must be >= 1 rows, got {self.row_memory}")

    def start(
        self, rule: BatchStop | None, head: object, max_cap: int, rows: int = 1, prefill: float = 0.0
    ) -> RoundGate | None:
        """The next decode's gate, of `rows` rows whose draft prefill costs `prefill` autoregressive rounds,
        under `rule` for a policy with SpecDec++'s `head` (None: none) and cap `max_cap`; None where the
        rule has no gate."""
        if rule is None or not rule.gate or head is None or max_cap < 1:
            return None
        # the first decode explores anyway: its history is empty
        doubling = (self.decodes + 1) & self.decodes == 0  # this is the 2nd, 4th, 8th, ... decode
        chosen = self.history.gain is not None and (
            doubling or self.explored + rows <= self.explore_share * (self.rows + rows)
        )  # fmt: skip
        self.decodes, self.rows = self.decodes + 1, self.rows + rows
        self.explored += rows if chosen else 0
        prior, atoms = (GateStats(), None) if chosen else (self.history, self.atoms)
        last = self.last_cap
        reach = max_cap if not chosen or last is None else min(max_cap, max(2, 2 * last + 1))
        return RoundGate(rule, max_cap, prior, self.min_observations, prefill=prefill, atoms=atoms,
                         open_cap=reach)  # fmt: skip

    def remember(self, gate: RoundGate) -> tuple[int, bool]:
        """After a decode: its own tallies, if it drafted, join the history (the older halved) and its rows
        the atoms (the `row_memory` most recent kept). Returns the cap the decode ran at its end (its open cap
        where it stayed open) and whether it explored (started from nothing)."""
        assert gate.open_cap is not None
        self.last_cap = gate.open_cap if gate.choice is None else gate.choice
        if gate.own.gain is not None:
            self.history = self.history.scaled(0.5) + gate.tallies()
            rows = gate.row_atoms()
            self.atoms = (rows if self.atoms is None else self.atoms + rows).last(self.row_memory)
        return self.last_cap, gate.prior.gain is None


def draft_prefill_rounds(
    feed: TokenFeed | None, prompt_tokens: int, rule: BatchStop | None, batch: int
) -> float:
    """The draft's prefill of `prompt_tokens` prompt tokens over `batch` rows, in autoregressive rounds: at
    the rate of the `feed`'s catch-ups so far (`TokenFeed.catch_up_s` / `catch_up_tokens`, a decode's first
    being its prefill) over the measured round (`BatchCosts.round_s_at`); 0 before any or unmeasured."""
    if feed is None or not feed.catch_up_tokens or rule is None or rule.costs is None:
        return 0.0
    return feed.catch_up_s / feed.catch_up_tokens * prompt_tokens / rule.costs.round_s_at(batch)
