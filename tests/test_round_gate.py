"""The round gate of batched SpecDec++ (`acchead.inference.round_gate`, docs/batched.md): its arithmetic by
hand, its price from measured costs, its memory across decodes (decodes under it:
tests/test_round_gate_decoding.py)."""

from __future__ import annotations

import functools
import math
import types

import pytest
import torch

from acchead.errors import AccheadError
from acchead.inference.batch_cost import BatchCost, BatchCosts
from acchead.inference.batch_stop import BatchStop, parse_batch_stop
from acchead.inference.batched_rows import Row
from acchead.inference.round_gate import GateMemory, GateStats, RoundGate, draft_prefill_rounds
from acchead.inference.slowest_row import RowAtoms


def _row(generated: int, max_new: int) -> Row:
    return Row(ids=[1] * (2 + generated), prompt_len=2, max_new=max_new, seed=0, stop_check=None)


def _play(gate: RoundGate, rows: list[Row], rounds: list[tuple[int, list[tuple[int, int]]]]) -> None:
    """Rounds of `rows`: (draft forwards, [(drafted, accepted) per row]) each, then the gate's `ran`."""
    for forwards, verdicts in rounds:
        for r, (n, tau) in zip(rows, verdicts, strict=True):
            r.res.drafted_per_round.append(n)
            r.res.accepted_per_round.append(tau)
        gate.ran(forwards, rows)


# Two open rounds of two rows, 20 new tokens each, 4 and 2 made: row a drafted 2 then 3 candidates (2 and 3
# draft forwards), row b 1 then 2; each had 1 accepted, then none. Under cap 1 or 2 the gains are the same,
# 2 then 1 for both rows: pooled mean 1.5, variance 1/3, and the rows do not differ (both means 1.5), so each
# row's mean is 1.5 (its own shrunk by 2 pseudo-rounds); m = 16 and 18, e_2 = 0.589:
# N = max(16/1.5 + e_2·√(16/3 / 1.5³), 18/1.5 + e_2·√(18/3 / 1.5³)) = 12.786; N_AR = 18. Draft forwards a
# round: min(d, 1) = 1, min(d, 2) = 2, so ρ_1 = 1 + c, ρ_2 = 1 + 2c.
HAND = [(2, [(2, 1), (1, 1)]), (3, [(3, 0), (2, 0)])]


@pytest.mark.parametrize(
    ("c", "costs", "choice"),
    [
        (0.1, [18.0, 14.065, 15.343], 1),  # cap 1: 1.1·12.786 < 18
        (0.4, [18.0, 17.9, 23.015], 1),  # 1.4·12.786 = 17.9 < 18, barely
        (0.5, [18.0, 19.179, 25.572], 0),  # autoregressive: 1.5·12.786 ≥ 18
    ],
)
def test_gate_estimate_hand_computed(c, costs, choice):
    rows = [_row(4, 20), _row(2, 20)]
    gate = RoundGate(BatchStop(c, gate=True), max_cap=2, min_observations=4)
    _play(gate, rows, HAND)
    est = gate.estimate(rows)
    assert [round(x, 3) for x in est.costs] == costs and est.choice == choice
    assert gate.cap(rows) == choice == gate.choice and gate.closed is (choice == 0)
    assert gate.cap(rows) == choice  # kept for the rest of the decode
    # a finished row weighs in the means but not in N: only row a decodes on (one row: e_1 = 0)
    ar, cap1 = gate.estimate(rows[:1]).costs[:2]
    assert ar == 16.0 and math.isclose(cap1, (1 + c) * 16 / 1.5)


def test_gate_prices_the_drafts_prefill_until_it_drafts():
    """A decode whose draft has not read its prompts yet (a gate choosing from the memory before its first
    round) pays the draft's prefill on its first drafting round: every cap above 0 costs it more (here 5
    rounds: cap 1's 14.065 becomes 19.065 > 18, so autoregressive); once a round drafted it is paid."""
    rows = [_row(4, 20), _row(2, 20)]
    played = RoundGate(BatchStop(0.1, gate=True), max_cap=2, min_observations=4)
    _play(played, rows, HAND)
    free = RoundGate(BatchStop(0.1, gate=True), 2, played.tallies(), min_observations=4)
    priced = RoundGate(BatchStop(0.1, gate=True), 2, played.tallies(), min_observations=4, prefill=5.0)
    base, more = free.estimate(rows).costs, priced.estimate(rows).costs
    assert more[0] == base[0]
    assert all(math.isclose(m - b, 5.0) for m, b in zip(more[1:], base[1:], strict=True))
    assert base[1] < 18.0 <= more[1] and priced.estimate(rows).choice == 0
    _play(priced, rows, HAND[:1])  # a drafting round: the prefill is behind it
    assert priced.prefill == 0.0
    with pytest.raises(AccheadError):
        RoundGate(BatchStop(0.1, gate=True), 2, prefill=-1.0)


def test_draft_prefill_rounds_from_the_feeds_catch_ups():
    """0.5 s for 100 catch-up tokens, 200 prompt tokens, an autoregressive round of 10 ms at B = 4: 100
    rounds; nothing timed yet, no feed, or costs not measured: 0."""
    costs = BatchCosts((BatchCost(4, step_s=0.002, round_s=0.010),))
    rule = BatchStop(costs=costs, gate=True)
    feed = types.SimpleNamespace(catch_up_s=0.5, catch_up_tokens=100)
    assert math.isclose(draft_prefill_rounds(feed, 200, rule, 4), 100.0)
    assert draft_prefill_rounds(types.SimpleNamespace(catch_up_s=0.0, catch_up_tokens=0), 200, rule, 4) == 0
    assert draft_prefill_rounds(None, 200, rule, 4) == 0.0
    assert draft_prefill_rounds(feed, 200, BatchStop(measure=True, gate=True), 4) == 0.0


def test_gate_weighs_the_slowest_row():
    """Row a gained 2, 2 and row b 1, 1 (never an accepted candidate): the rows differ (their means' variance
    0.5 less the rounds' noise 1/3 · 2/4 leaves 1/3), so row b's own mean counts (weight var / between = 1
    pseudo-round: μ_b = (2 + 1.5) / 3), its remaining doubt widens its spread, and the batch, as slow as
    row b, gains nothing from drafting even at c = 0.01."""
    rows = [_row(4, 20), _row(2, 20)]
    gate = RoundGate(BatchStop(0.01, gate=True), max_cap=2, min_observations=4)
    _play(gate, rows, [(2, [(2, 1), (1, 0)]), (3, [(3, 1), (2, 0)])])
    assert torch.allclose(gate.tallies().between, torch.full((2,), 1 / 3, dtype=torch.float64))
    assert [round(x, 3) for x in gate.estimate(rows).costs] == [18.0, 18.451, 18.634]
    assert gate.cap(rows) == 0


def test_gate_stays_open_while_the_policys_own_cap_is_cheapest():
    """Rows that accepted 2 candidates in some rounds gain more under cap 2 than cap 1; with c = 0.01 the cap
    of 2 (the policy's own) is cheapest, so the gate stays open (the policy's caps) and weighs again next
    round."""
    rows = [_row(4, 20), _row(2, 20)]
    gate = RoundGate(BatchStop(0.01, gate=True), max_cap=2, min_observations=4)
    _play(gate, rows, [(2, [(2, 2), (2, 1)]), (3, [(3, 1), (2, 2)])])
    assert [round(x, 3) for x in gate.estimate(rows).costs] == [18.0, 9.09, 7.717]
    assert gate.cap(rows) == 2 and gate.choice is None


def test_gate_drafts_until_min_observations_and_stops_counting_once_closed():
    rows = [_row(2, 20), _row(2, 20)]
    gate = RoundGate(BatchStop(0.5, gate=True), max_cap=3, min_observations=5)
    _play(gate, rows, [(3, [(1, 0), (1, 0)]), (0, [(0, 0), (0, 0)]), (1, [(1, 0), (0, 0)])])
    assert gate.own.n.tolist() == [3.0] * 3 and gate.own.rounds.tolist() == [2.0] * 3
    assert gate.cap(rows) == 3  # 3 < 5 observations: open
    _play(gate, rows, [(1, [(1, 0), (1, 0)])])
    assert gate.cap(rows) == 0 and gate.closed  # 5, nothing accepted: ρ > 1 = μ for every cap
    _play(gate, rows, [(1, [(1, 0), (1, 0)])])  # a round after closing (played as drafted) is not tallied
    assert gate.own.n.tolist() == [5.0] * 3
    assert gate.own.forwards.tolist() == [3.0, 4.0, 5.0]  # min(d, k) over d = 3, 1, 1
    with pytest.raises(AccheadError):
        RoundGate(BatchStop(0.5, gate=True), max_cap=3, min_observations=0)


def test_a_capped_round_prices_the_caps_up_to_its_own():
    """Under a chosen cap of 2 a round's verdicts price caps 1 and 2 (the same draws, the same first
    verdicts), not 3; a cap no round priced is never chosen, and the gate weighs by cap 1's count."""
    rows = [_row(2, 20), _row(2, 20)]
    gate = RoundGate(BatchStop(0.1, gate=True), max_cap=3, min_observations=4)
    gate.choice = 2
    _play(gate, rows, [(2, [(2, 2), (2, 1)]), (2, [(2, 0), (1, 1)])])
    assert gate.own.n.tolist() == [4.0, 4.0, 0.0] and gate.own.rounds.tolist() == [2.0, 2.0, 0.0]
    assert gate.own.gain.tolist() == [7.0, 8.0, 0.0]  # g_1: 2, 2, 1, 2; g_2: 3, 2, 1, 2
    assert gate.own.forwards.tolist() == [2.0, 4.0, 0.0]
    atoms = gate.row_atoms()
    assert atoms.n.tolist() == [[2.0, 2.0, 0.0]] * 2
    assert atoms.mean.tolist() == [[1.5, 2.0, 0.0], [2.0, 2.0, 0.0]]
    fresh = RoundGate(BatchStop(0.1, gate=True), 3, gate.tallies(), min_observations=4)
    est = fresh.estimate(rows)
    assert est.costs[3] == math.inf and est.choice in (1, 2)
    assert RoundGate(BatchStop(0.1, gate=True), 3, gate.tallies(), min_observations=5).estimate(rows) is None


def test_a_cap_priced_by_fewer_than_min_observations_is_never_chosen():
    """Cap 2 gains 3 tokens a round against cap 1's 2, so at c = 0.01 it is cheapest, but only one open round
    of two rows priced it (the rounds after ran cap 1): below 4 observations it is not chosen."""
    rows = [_row(2, 20), _row(2, 20)]
    gate = RoundGate(BatchStop(0.01, gate=True), max_cap=2, min_observations=4)
    _play(gate, rows, [(2, [(2, 2), (2, 2)])])
    gate.choice = 1
    _play(gate, rows, [(1, [(1, 1), (1, 1)])] * 2)
    assert gate.own.n.tolist() == [6.0, 2.0]
    est = gate.estimate(rows)
    assert est.costs[2] == math.inf and est.choice == 1
    looser = RoundGate(BatchStop(0.01, gate=True), 2, gate.tallies(), min_observations=2)
    assert looser.estimate(rows).choice == 2


def test_gate_stats_pool_and_weigh():
    t = functools.partial(torch.tensor, dtype=torch.float64)
    a = GateStats(4, t([6.0, 6.0]), t([10.0, 10.0]), 2, t([2.0, 4.0]))  # gains 2, 2, 1, 1 under both caps
    b = GateStats(2, t([2.0, 3.0]), t([2.0, 5.0]), 1, t([1.0, 2.0]))
    both = a + b
    assert both.n.tolist() == [6.0] * 2 and both.gain.tolist() == [8.0, 9.0]
    assert both.forwards.tolist() == [3.0, 6.0]
    assert a.scaled(0.5).gain.tolist() == [3.0, 3.0] and a.scaled(0.5).rounds.tolist() == [1.0] * 2
    assert a.mean.tolist() == [1.5, 1.5] and torch.allclose(a.var, t([1 / 3, 1 / 3]))
    assert (GateStats() + a) is a and (a + GateStats()) is a and GateStats().scaled(0.5).gain is None


def test_gate_memory_starts_from_earlier_decodes_and_explores():
    """Decode 0 explores (no prior), and so do the 2nd and 4th decodes (1 and 3); decodes 2 and 4 start from
    the tallies so far, and a prior that says autoregressive closes the gate before the first round. Decode
    3's open rounds are capped at 2 (2·0 + 1, at least 2: decode 2 closed). A decode that drafted nothing
    leaves the history as it was; one that drafted halves the older tallies."""
    memory, rule = GateMemory(explore_share=0.25, min_observations=8), BatchStop(0.5, gate=True)
    rows = [_row(0, 20) for _ in range(2)]
    gates = []
    for _ in range(5):
        gate = memory.start(rule, object(), 3, len(rows))
        gates.append(gate)
        if gate.prior.gain is None:  # 8 rows' rounds, nothing accepted
            _play(gate, rows, [(1, [(1, 0), (1, 0)])] * 4)
        else:
            assert gate.cap(rows) == 0  # the prior alone: ρ > 1 = μ
        memory.remember(gate)
    assert [float(torch.as_tensor(g.prior.n).max()) for g in gates] == [0, 0, 12, 0, 14]
    # (8 halved + 8) halved + the 8 of decode 3 under caps 1-2 (decode 2 drafted nothing)
    assert memory.history.n.tolist() == [14.0, 14.0, 6.0]
    assert memory.history.rounds.tolist() == [7.0, 7.0, 3.0]
    assert [g.open_cap for g in gates] == [3, 3, 3, 2, 3]
    # the exploring decodes start without the earlier rows too; the others with those of the drafting decodes
    assert [None if g.atoms is None else len(g.atoms) for g in gates] == [None, None, 4, None, 6]
    assert memory.start(None, object(), 3) is None and memory.start(rule, None, 3) is None
    assert (memory.decodes, memory.rows, memory.explored) == (5, 10, 4)
    with pytest.raises(AccheadError, match="explore_share"):
        GateMemory(explore_share=0.0)
    with pytest.raises(AccheadError, match="row_memory"):
        GateMemory(row_memory=0)


def test_gate_memory_explores_a_share_of_rows_not_of_decodes():
    """At a constant batch size the 1st, 2nd, 4th, 8th, 16th and 32nd decodes explore, then about every 8th
    (the 48th: its rows make 24 of 192); a batch of 64 after 48 batches of 4 (192 rows, 24 of them explored by
    choice) starts from the memory, since exploring it would make 88 of 256 rows; the same memory explores a
    batch of 4 once the share allows."""
    memory, rule = GateMemory(), BatchStop(0.5, gate=True)
    rows, explored = [_row(0, 20) for _ in range(4)], []
    for _ in range(48):
        gate = memory.start(rule, object(), 3, len(rows))
        explored.append(gate.prior.gain is None)
        if gate.prior.gain is None:  # one round of 4 rows, each a candidate drafted and rejected
            _play(gate, rows, [(1, [(1, 0)] * 4)])
        memory.remember(gate)
    assert [i for i, e in enumerate(explored) if e] == [0, 1, 3, 7, 15, 31, 47]
    assert (memory.rows, memory.explored) == (192, 24)
    assert memory.start(rule, object(), 3, 64).prior.gain is not None  # 88 > 256 / 8
    assert memory.explored == 24 and memory.rows == 256
    assert memory.start(rule, object(), 3, 4).prior.gain is None  # 28 <= 260 / 8 (the 50th decode)


def test_an_exploring_decode_reaches_twice_the_latest_cap():
    """The first decode opens at the policy's cap; a later exploring decode opens at 2c + 1 (at least 2, at
    most K) for the cap c the latest decode ran, and its open rounds price only the caps up to that: a
    decode that closed (c = 0) explores caps 1-2, one that capped at 3 caps 1-7, one that stayed open K."""
    rule, K = BatchStop(0.5, gate=True), 20
    rows = [_row(0, 40) for _ in range(4)]
    for last, reach in [(None, K), (0, 2), (3, 7), (12, K), (K, K)]:
        memory = GateMemory(explore_share=1.0, min_observations=8)
        if last is not None:  # an earlier decode that ran cap `last` (K: stayed open)
            earlier = memory.start(rule, object(), K, len(rows))
            _play(earlier, rows, [(1, [(1, 0)] * 4)])
            earlier.choice = None if last == K else last
            memory.remember(earlier)
        gate = memory.start(rule, object(), K, len(rows))
        assert gate.prior.gain is None and gate.open_cap == reach and gate.cap(rows) == reach
        _play(gate, rows, [(reach, [(reach, reach)] * 4)])  # every candidate accepted
        assert gate.own.n.tolist() == [4.0] * reach + [0.0] * (K - reach)
    with pytest.raises(AccheadError, match="open cap"):
        RoundGate(rule, max_cap=3, open_cap=4)


def test_round_ratio_from_measured_costs():
    """ρ = 1 + c₁(B) + (d − 1)·c(B): at B = 4, t_round 10 ms, a K = 1 round 14 ms (c₁ = 0.4), a forward more
    2 ms (c = 0.2); without a first forward's time, c₁ = c."""
    costs = BatchCosts((BatchCost(4, step_s=0.002, round_s=0.010, first_s=0.004),))
    rule = BatchStop(costs=costs, gate=True)
    assert math.isclose(rule.round_ratio(4, 1.0), 1.4) and math.isclose(rule.round_ratio(4, 3.0), 1.8)
    assert math.isclose(costs.c_first_at(16), 0.4)  # clamped past the largest size
    assert math.isclose(BatchCost(4, 0.002, 0.010).c_first, 0.2)
    assert str(rule) == "batch-stop:gated(B4:c=0.2)"
    assert str(BatchStop(0.3, gate=True)) == "batch-stop:c=0.3,gate"
    assert parse_batch_stop("gated", 0.8) == BatchStop(measure=True, gate=True)
    with pytest.raises(AccheadError, match="not measured yet"):
        BatchStop(measure=True, gate=True).round_ratio(4, 1.0)
    with pytest.raises(AccheadError):
        BatchCosts((BatchCost(4, 0.002, 0.010, first_s=-0.001),))


def test_gate_prices_the_slowest_row_from_earlier_rows():
    """A decode of 16 rows, 18 tokens each, starts from a memory of rounds that gained 2 tokens but one (1):
    under cap 1 at c = 0.5 the normal model sees rows that barely differ and drafts. Earlier rows (atoms) of
    which 4 in 64 gained 1 a round say a batch of 16 holds such a row with probability 1 − (60/64)^16 =
    0.64, then needing all 18 rounds: N_1 = 18 − 9·(60/64)^16 = 14.8, at 1.5 an AR round's price more than
    AR's 18. Rows whose own rounds all gained 2 are not those: with them the gate drafts again."""
    rows = [_row(2, 20) for _ in range(16)]
    played = RoundGate(BatchStop(0.5, gate=True), max_cap=1, min_observations=32)
    _play(played, rows, [(1, [(1, 0)] + [(1, 1)] * 15), (1, [(1, 1)] * 16)])
    slow = RowAtoms(torch.full((64, 1), 20.0, dtype=torch.float64),
                    torch.tensor([[2.0]] * 60 + [[1.0]] * 4, dtype=torch.float64))  # fmt: skip
    fresh = [_row(0, 18) for _ in range(16)]
    assert RoundGate(BatchStop(0.5, gate=True), 1, played.tallies()).estimate(fresh).choice == 1
    est = RoundGate(BatchStop(0.5, gate=True), 1, played.tallies(), atoms=slow).estimate(fresh)
    assert est.choice == 0 and abs(est.costs[1] - 1.5 * (18 - 9 * (60 / 64) ** 16)) < 0.1
    played.atoms = slow
    assert played.estimate(rows).choice == 1


def test_an_open_gate_weighs_again_once_its_evidence_grew_by_a_quarter():
    """A row that accepts every candidate keeps the gate open (the policy's cap 2 the cheapest). It weighs
    first at 4 rounds (min_observations), then once the rounds it has seen are 1.25 times those it last
    weighed at: after rounds 4, 5, 7, 9 and 12 of 12, not after each."""
    rows = [_row(0, 80)]
    gate = RoundGate(BatchStop(0.01, gate=True), max_cap=2, min_observations=4)
    weighed = []
    for i in range(1, 13):
        _play(gate, rows, [(2, [(2, 2)])])
        before = gate.last
        assert gate.cap(rows) == 2 and gate.choice is None
        weighed += [i] if gate.last is not before else []
    assert weighed == [4, 5, 7, 9, 12]
    with pytest.raises(AccheadError, match="reweigh"):
        RoundGate(BatchStop(0.01, gate=True), max_cap=2, reweigh=0.0)


def test_a_halved_memory_keeps_its_rows_mean_gain():
    """The memory halves older decodes' tallies, row counts included: 2 rows gaining 3 tokens every round
    under cap 2 become 0.25 rows summing to 0.75 after three halvings, still a mean of 3 (a cap with too few
    atoms, here cap 2, takes its centre from it: until the thirty-eighth session's fix the count was clamped
    at 1, a mean of 0.75, and caps priced so were put at ~63 rounds of 64)."""
    rows = [_row(2, 20), _row(2, 20)]
    played = RoundGate(BatchStop(0.1, gate=True), max_cap=2, min_observations=4)
    _play(played, rows, [(2, [(2, 2), (2, 2)])] * 4)
    f64 = functools.partial(torch.tensor, dtype=torch.float64)
    atoms = RowAtoms(f64([[20.0, 0.0]] * 32), f64([[1.5, 0.0], [1.9, 0.0]] * 16))  # cap 1 alone
    costs = []
    for weight in (1.0, 0.125):
        gate = RoundGate(BatchStop(0.1, gate=True), 2, played.tallies().scaled(weight), min_observations=1,
                         atoms=atoms)  # fmt: skip
        costs.append(gate.estimate(rows).costs)
    assert costs[1][0] == costs[0][0] and math.isclose(costs[1][2], costs[0][2], rel_tol=1e-6)
    assert costs[0][2] < 0.8 * 18  # 18 tokens at ~3 a round, well below AR's 18 rounds
