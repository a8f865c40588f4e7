"""The round gate of batched SpecDec++ (`acchead.inference.round_gate`, docs/batched.md): its arithmetic by
hand, its price from measured costs, and decodes under it: greedy rows equal the target's on each prompt
alone (eager, fast twin, feature draft), a sampled row follows the target's exact distribution."""

from __future__ import annotations

import functools
import math
from collections import Counter

import pytest
import torch
from exact_models import _chi_square_p_value, _exact_sequences, _peaked_llama, _perturbed
from test_batched import MAX_NEW, PROMPTS, _decoder, _heads
from test_feature_draft import trained_feature_pair
from torch._dynamo.utils import counters

import acchead.inference.batched as batched
from acchead.errors import AccheadError
from acchead.inference.batch_cost import BatchCost, BatchCosts
from acchead.inference.batch_stop import BatchStop, parse_batch_stop
from acchead.inference.batched import BatchedDecoder
from acchead.inference.batched_rows import Row
from acchead.inference.round_gate import GateMemory, GateStats, RoundGate, expected_max_normal
from acchead.sampling import SamplingConfig


def _row(generated: int, max_new: int, accepted: list[int], drafted: list[int]) -> Row:
    row = Row(ids=[1] * (2 + generated), prompt_len=2, max_new=max_new, seed=0, stop_check=None)
    row.res.accepted_per_round, row.res.drafted_per_round = accepted, drafted
    return row


def test_expected_max_normal():
    assert expected_max_normal(1) == 0.0
    assert [round(expected_max_normal(n), 2) for n in (2, 4, 16, 64)] == [0.59, 1.05, 1.77, 2.34]
    with pytest.raises(AccheadError):
        expected_max_normal(0)


def test_gate_estimate_hand_computed():
    """Two rows after two drafting rounds of one forward: gains (1 + τ) 2, 2 and 1, 1, 20 new tokens each.
    Pooled mean 1.5, variance 1/3; μ_a = (4 + 2·1.5) / 4 = 1.75, μ_b = (2 + 3) / 4 = 1.25; m = 16 and 18;
    e_2 = 0.589: N_spec = max(16/1.75 + e_2·√(16/3 / 1.75³), 18/1.25 + e_2·√(18/3 / 1.25³)) = 15.433,
    N_AR = 18. Declared c = 0.2: ρ = 1.2, 18.52 ≥ 18, autoregressive from here; c = 0.1: ρ = 1.1, 16.98 <
    18, draft."""
    rows = [_row(4, 20, [1, 1], [2, 3]), _row(2, 20, [0, 0], [1, 2])]
    for c, drafts in ((0.2, False), (0.1, True)):
        gate = RoundGate(BatchStop(c, gate=True), min_observations=4)
        for _ in range(2):
            gate.ran(1)
        est = gate.estimate(rows, rows)
        assert (est.ar_rounds, round(est.spec_rounds, 3), est.ratio) == (18.0, 15.433, 1 + c)
        assert gate.draft(rows, rows) is drafts and gate.closed is not drafts
        assert gate.draft(rows, rows) is drafts  # closed stays closed
    # a finished row weighs in the means but not in N: only row a decodes on (one row: e_1 = 0)
    est = RoundGate(BatchStop(0.2, gate=True), forwards=[1, 1], min_observations=4).estimate(rows, rows[:1])
    assert (est.ar_rounds, est.spec_rounds) == (16.0, 16 / 1.75)


def test_gate_drafts_until_min_observations_and_counts_forwards():
    rows = [_row(2, 20, [0, 0], [1, 1]), _row(2, 20, [0, 0], [1, 1])]  # nothing accepted: 4 observations
    gate = RoundGate(BatchStop(0.5, gate=True), min_observations=5)
    assert gate.draft(rows, rows) and not gate.ran(3)  # 4 < 5 observations: draft
    assert gate.draft(rows, rows) and not gate.ran(0)  # a round without draft forwards does not count
    rows[0].res.accepted_per_round.append(0)
    rows[0].res.drafted_per_round.append(1)
    assert gate.draft(rows, rows) is False and gate.ran(0)  # 5: ρ = 1 + 0.5·3 = 2.5 > 1 = μ
    assert gate.last is not None and gate.last.ratio == 2.5 and gate.draft(rows, rows) is False
    assert gate.stats(rows) == GateStats(n=5, gain=5, gain2=5, rounds=1, forwards=3)
    with pytest.raises(AccheadError):
        RoundGate(BatchStop(0.5, gate=True), min_observations=0)


def test_gate_stats_pool_and_weigh():
    a, b = GateStats(4, 6, 10, 2, 2), GateStats(2, 2, 2, 1, 3)
    assert a + b == GateStats(6, 8, 12, 3, 5) and a.scaled(0.5) == GateStats(2, 3, 5, 1, 1)
    assert a.mean == 1.5 and math.isclose(a.var, 1 / 3)  # gains 2, 2, 1, 1


def test_gate_memory_starts_from_earlier_decodes_and_explores():
    """Decode 0 explores (no prior); decodes 1-3 start from the tallies so far, and a prior that says
    autoregressive closes the gate before the first round; decode 4 explores again. A decode that drafted
    nothing leaves the history as it was; one that drafted halves the older tallies."""
    memory, rule = GateMemory(explore_every=4), BatchStop(0.5, gate=True)
    rows = [_row(0, 20, [0] * 4, [1] * 4) for _ in range(2)]  # 8 rounds, nothing accepted
    gates = []
    for _ in range(5):
        gate = memory.start(rule)
        gates.append(gate)
        if gate.prior.n == 0:
            for _ in range(4):
                gate.ran(1)
            memory.remember(gate, rows)
        else:
            assert gate.draft(rows[:0], rows) is False  # the prior alone: ρ = 1.5 > 1 = μ
            memory.remember(gate, [])
    assert [g.prior.n for g in gates] == [0, 8, 8, 8, 0]
    assert memory.history == GateStats(12, 12, 12, 6, 6)  # 8 halved + the 8 of decode 4
    assert memory.start(None) is None and memory.decodes == 5
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


@pytest.fixture(scope="module")
def peaked_pair():
    target = _peaked_llama(12, seed=3)
    return target, _perturbed(target, 0.5, seed=4)


# c = 0.9: a drafting round prices at ~2 autoregressive rounds, so the gate closes on this pair
GATED = BatchStop(0.9, gate=True)


@pytest.mark.parametrize(("spec", "kind"), [("specdecpp:h=0.5,max=4", "candidate"),
                                            ("specdecpp:h=0.4,max=4", "lookahead")])  # fmt: skip
@pytest.mark.parametrize("fast", [False, True])
def test_gated_greedy_rows_equal_generate_alone(peaked_pair, spec, kind, fast):
    """The gate closes mid-decode (rows then decode autoregressively, the draft left behind): every row still
    equals the target's greedy `generate` on its prompt alone, on the eager path and the fast path's twin."""
    target, _ = peaked_pair
    dec = _decoder(peaked_pair, spec, kind, batch_stop=GATED, fast=fast, compile=False)
    res = dec.generate(PROMPTS, max_new_tokens=MAX_NEW, temperature=0, eos_token_id=5)
    assert res.gate_rounds > 0 and res.draft_calls > 0  # it drafted, then it closed
    assert res.to_dict()["gate_rounds"] == res.gate_rounds
    # the next decode starts from this one's tallies: closed before its first round, nothing drafted
    again = dec.generate(PROMPTS, max_new_tokens=MAX_NEW, temperature=0, eos_token_id=5)
    assert again.draft_calls == 0 and again.gate_rounds == again.target_calls
    for b, prompt in enumerate(PROMPTS):
        ref = target.generate(torch.tensor([prompt]), max_new_tokens=MAX_NEW[b], do_sample=False,
                              eos_token_id=5, pad_token_id=0)[0, len(prompt) :]  # fmt: skip
        assert res.rows[b].new_ids.tolist() == again.rows[b].new_ids.tolist() == ref.tolist(), b
    ungated = _decoder(peaked_pair, spec, kind, batch_stop=BatchStop(0.9), fast=fast, compile=False)
    assert ungated.generate(PROMPTS, max_new_tokens=MAX_NEW, temperature=0).gate_rounds == 0


@pytest.mark.parametrize("compile", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_gated_feature_draft_rows_equal_generate_alone(tmp_path_factory, compile):
    """A feature draft under the gate: a closed gate's rounds verify without the target's states (another
    shape, compiled by `warm_up`: nothing compiles while decoding), rows equal to the target's alone."""
    target, draft = trained_feature_pair(tmp_path_factory)
    head = _heads(draft.config.hidden_size)["lookahead"]
    prompts = [[5, 9, 2, 7], [3], [8, 1, 4]]
    dec = BatchedDecoder(target, draft, "specdecpp:h=0.5,max=5", head=head, batch_stop=GATED, fast=compile,
                         compile=compile)  # fmt: skip
    dec.warm_up(len(prompts), 20)
    graphs = counters["stats"]["unique_graphs"]
    res = dec.generate(prompts, max_new_tokens=16, temperature=0)
    again = dec.generate(prompts, max_new_tokens=16, temperature=0)  # closed from the prefill on
    assert counters["stats"]["unique_graphs"] == graphs and res.gate_rounds > 0 and again.draft_calls == 0
    for b, prompt in enumerate(prompts):
        ref = target.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False, eos_token_id=None,
                              pad_token_id=0)  # fmt: skip (no EOS: the config's would end row 0 at once)
        ref = ref[0, len(prompt) :].tolist()
        assert res.rows[b].new_ids.tolist() == again.rows[b].new_ids.tolist() == ref, b


def test_chi_square_gated_row(peaked_pair, monkeypatch):
    """Row 1 of a ragged batch under the gate deciding from the first drafting round (2 observations; each
    decode from its own), so whether the next round drafts depends on how the first went: its 3-token
    continuations follow the target's exact distribution."""
    target, _ = peaked_pair
    fresh = functools.partial(GateMemory, explore_every=1, min_observations=2)  # each decode its own gate
    monkeypatch.setattr(batched, "GateMemory", fresh)
    dec = _decoder(peaked_pair, "specdecpp:h=0.4,max=2", "lookahead", batch_stop=GATED)
    prompts, n = [[3, 5, 7, 9], [1, 4], [2]], 250
    counts: Counter = Counter()
    gated = 0
    for s in range(n):
        res = dec.generate(prompts, max_new_tokens=[5, 3, 4], temperature=1.0, seed=[7 * s, s, 3 * s + 1])
        counts[tuple(res.rows[1].new_ids.tolist())] += 1
        gated += res.gate_rounds > 0 and res.rows[1].rounds > 1
    assert 0 < gated < n  # the gate closed in some decodes and not in others while row 1 decoded
    assert _chi_square_p_value(counts, _exact_sequences(target, prompts[1], 3, SamplingConfig(1.0)), n) > 1e-3
