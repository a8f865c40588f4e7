"""The batch rule's measured cost ratio c(B) (`acchead.inference.batch_cost`, docs/batched.md): its
arithmetic and interpolation by hand, its measurement on tiny models, and a batched decoder that measures
it before decoding (greedy rows still equal the rows' own rule's, which is exact)."""

from __future__ import annotations

import math
import types

import pytest
import torch
from exact_models import _peaked_llama, _perturbed
from test_batched import PROMPTS, _decoder

from acchead.errors import AccheadError
from acchead.inference.batch_cost import BatchCost, BatchCosts, calibration_sizes, measure_batch_costs
from acchead.inference.batch_stop import BatchStop, parse_batch_stop
from acchead.inference.batched import BatchedDecoder


def _cost(batch: int, step: float, round_: float) -> BatchCost:
    return BatchCost(batch=batch, step_s=step, round_s=round_)


def test_c_is_one_more_candidate_over_an_autoregressive_round():
    assert math.isclose(_cost(4, 0.005, 0.010).c, 0.5)  # 5 ms / 10 ms


def test_a_rounds_price_is_read_off_the_timed_rounds_of_its_forwards():
    """Rounds of 1, 2, 3 forwards timed at 14, 19, 20 ms against an autoregressive 10 ms: a round of 2 costs
    1.9 (the line through 1 and 3, 1.7, would underprice it), 2.5 halfway to 3, 4 past the last by c = 0.3
    a forward; without timed rounds, 1 + c₁ + (d − 1)·c. Interpolated in log B as c is."""
    timed = BatchCost(4, step_s=0.003, round_s=0.010, first_s=0.004, drafted_s=(0.014, 0.019, 0.020))
    assert [round(timed.round_ratio(d), 6) for d in (1, 2, 2.5, 3, 4)] == [1.4, 1.9, 1.95, 2.0, 2.3]
    assert timed.round_ratio(0.5) == pytest.approx(1.4)  # a mean below 1 forward: the first round's
    line = BatchCost(4, step_s=0.003, round_s=0.010, first_s=0.004)
    assert line.round_ratio(2) == pytest.approx(1.7) and line.round_ratio(3) == pytest.approx(2.0)
    costs = BatchCosts((timed, BatchCost(16, step_s=0.003, round_s=0.010, first_s=0.004)))
    assert costs.round_ratio_at(8, 2) == pytest.approx(1.8)  # halfway in log B between 1.9 and 1.7
    assert BatchStop(costs=costs).round_ratio(4, 2) == pytest.approx(1.9)
    with pytest.raises(AccheadError):
        BatchCosts((BatchCost(4, 0.003, 0.010, drafted_s=(0.014, 0.0)),))


def test_c_at_interpolates_in_log_batch_and_clamps():
    costs = BatchCosts((_cost(16, 0.8, 1.0), _cost(1, 0.2, 1.0)))  # any order: sorted by B
    assert [c.batch for c in costs.costs] == [1, 16]
    assert math.isclose(costs.c_at(1), 0.2) and math.isclose(costs.c_at(16), 0.8)
    assert math.isclose(costs.c_at(4), 0.5)  # log 4 is halfway from log 1 to log 16
    assert math.isclose(costs.c_at(64), 0.8)  # beyond the largest measured size: its c
    assert str(costs) == "B1:c=0.2,B16:c=0.8"


@pytest.mark.parametrize(
    "bad",
    [
        (),
        (_cost(2, 1, 1), _cost(2, 1, 1)),
        (_cost(0, 1, 1),),
        (_cost(1, 1, 0.0),),
        (_cost(1, -0.1, 1),),
    ],
)
def test_batch_costs_refuse_bad_tables(bad):
    with pytest.raises(AccheadError):
        BatchCosts(bad)


def test_calibration_sizes():
    assert calibration_sizes(1) == [1]
    assert calibration_sizes(4) == [1, 4]
    assert calibration_sizes(10) == [1, 4, 10]
    assert calibration_sizes(64) == [1, 4, 16, 64]


def test_measured_rule_uses_c_at_the_batch_size():
    """Continue iff Σ P̂ > c(B)·B, with c(B) read at the rows decoding now."""
    rule = BatchStop(costs=BatchCosts((_cost(1, 0.2, 1.0), _cost(16, 0.8, 1.0))))
    log = torch.log(torch.tensor([0.9, 0.9, 0.9, 0.9], dtype=torch.float64))
    drafting = torch.ones(4, dtype=torch.bool)
    assert math.isclose(rule.ratio(4), 0.5)
    assert not rule.should_stop(log, drafting, 4)  # 3.6 > 0.5 · 4
    assert rule.should_stop(log, drafting, 16)  # 3.6 ≤ 0.8 · 16
    assert rule.h is None and str(rule) == "batch-stop:measured(B1:c=0.2,B16:c=0.8)"


def test_batch_stop_takes_one_source_of_c():
    for bad in ({}, {"c": 0.2, "measure": True}, {"c": 0.2, "costs": BatchCosts((_cost(1, 1, 1),))}):
        with pytest.raises(AccheadError, match="one of the two"):
            BatchStop(**bad)
    with pytest.raises(AccheadError, match="not measured yet"):
        BatchStop(measure=True).ratio(4)
    assert parse_batch_stop("measured", 0.8) == BatchStop(measure=True)
    with pytest.raises(AccheadError, match="specdecpp"):
        parse_batch_stop("measured", None)


@pytest.fixture(scope="module")
def pair():
    target = _peaked_llama(12, seed=3)
    return target, _perturbed(target, 0.5, seed=4)


def test_a_batch_result_times_each_round(pair):
    res = _decoder(pair, "specdec:k=3", None).generate(PROMPTS, 12, temperature=0)
    assert len(res.round_times) == len(res.round_draft_calls) == len(res.round_rows) == res.target_calls
    assert res.round_rows[0] == len(PROMPTS) and res.round_rows == sorted(res.round_rows, reverse=True)
    assert sum(res.round_draft_calls) == res.draft_calls and min(res.round_times) > 0
    assert sum(res.round_times) <= res.wall_time


def test_measure_batch_costs_times_the_decoders_rounds(pair):
    """c(B) from rounds of the batched decoder: the slope over rounds of K = 1, 2 and 3 over an autoregressive
    round; the rounds of each count of forwards kept for the round gate."""
    target, draft = pair
    timers = {
        "ar": BatchedDecoder(target, None, "autoregressive", single=False),
        "k1": BatchedDecoder(target, draft, "specdec:k=1", single=False),
        "k2": BatchedDecoder(target, draft, "specdec:k=2", single=False),
        "k3": BatchedDecoder(target, draft, "specdec:k=3", single=False),
    }
    costs = measure_batch_costs(timers, 12, [1, 3], rounds=8, repeats=1)
    assert [c.batch for c in costs.costs] == [1, 3]
    assert all(c.round_s > 0 and c.step_s >= 0 and len(c.drafted_s) == 3 for c in costs.costs)
    for c in costs.costs:
        assert c.round_ratio(2) == pytest.approx(c.drafted_s[1] / c.round_s)
    with pytest.raises(AccheadError, match="ar, k1, k2 and k3"):
        measure_batch_costs({"ar": timers["ar"]}, 12, [1])


def test_decoder_measures_c_at_the_sizes_it_meets(pair):
    """`batch_stop="measured"`: the first batch of 4 measures B = 1 and 4, a batch of 2 measures nothing
    more, one of 6 adds B = 6; greedy rows equal those of the rows' own rule (every stop rule is exact)."""
    plain = _decoder(pair, "specdecpp:h=0.5,max=6", "candidate").generate(PROMPTS, 12, temperature=0)
    dec = _decoder(pair, "specdecpp:h=0.5,max=6", "candidate", batch_stop="measured")
    assert str(dec.batch_stop) == "batch-stop:measured(pending)"
    res = dec.generate(PROMPTS, 12, temperature=0)
    assert [c.batch for c in dec.batch_stop.costs.costs] == [1, 4]
    assert [r.new_ids.tolist() for r in res.rows] == [r.new_ids.tolist() for r in plain.rows]
    dec.generate(PROMPTS[:2], 4, temperature=0)
    assert [c.batch for c in dec.batch_stop.costs.costs] == [1, 4]
    dec.generate([*PROMPTS, [5], [6, 7]], 4, temperature=0)
    assert [c.batch for c in dec.batch_stop.costs.costs] == [1, 4, 6]


def test_a_measured_table_is_passed_back_as_a_batch_stop(pair):
    """For repeatable runs: the table one decoder measured, given to another, is used as it is."""
    table = BatchStop(costs=BatchCosts((_cost(1, 0.2, 1.0), _cost(4, 1.4, 1.0))))
    dec = _decoder(pair, "specdecpp:h=0.5,max=6", "candidate", batch_stop=table)
    res = dec.generate(PROMPTS, 12, temperature=0)
    assert dec.batch_stop is table and res.batch_stops > 0  # c(4) = 1.4: the batch stops after one candidate
    with pytest.raises(AccheadError, match="specdecpp"):
        _decoder(pair, "specdec:k=2", None, batch_stop=table)


def test_decoders_of_one_pair_share_the_measured_costs(pair, monkeypatch):
    """c(B) is the pair's and the machine's, not a decoder's: a second measured decoder of the same target and
    draft (the bench's other head) reuses the first one's table instead of timing again; another draft is
    timed afresh."""
    first = _decoder(pair, "specdecpp:h=0.5,max=6", "candidate", batch_stop="measured")
    first.generate(PROMPTS, 4, temperature=0)
    calls = []

    def counted(decoders, vocab, sizes, **kw):
        calls.append(sizes)
        return BatchCosts(tuple(_cost(b, 0.1, 1.0) for b in sizes))

    monkeypatch.setattr("acchead.inference.batched.measure_batch_costs", counted)
    second = _decoder(pair, "specdecpp:h=0.7,max=6", "lookahead", batch_stop="measured")
    second.generate(PROMPTS, 4, temperature=0)
    assert calls == [] and second.batch_stop.costs == first.batch_stop.costs
    target, draft = pair
    other = BatchedDecoder(target, _perturbed(draft, 0.01, seed=5), "specdecpp:h=0.5,max=6",
                           head=second._rule.head, batch_stop="measured")  # fmt: skip
    other.generate(PROMPTS, 4, temperature=0)
    assert calls == [[1, 4]]


def test_rounds_after_a_row_finished_are_not_timed():
    """A round of fewer rows (eager rows leave the batch as they finish) is cheaper: the fit reads only the
    rounds of every row, here c = ((0.8 − 0.6) / 2) / 0.5 = 0.2, not the 1-row round's 0.01 s."""

    class Fake:
        def __init__(self, times, drafts, rows):
            self.res = types.SimpleNamespace(round_times=times, round_draft_calls=drafts, round_rows=rows)

        def generate(self, prompts, max_new_tokens, temperature):
            return self.res

    timers = {
        "ar": Fake([1.0, 0.5, 0.5], [0, 0, 0], [4, 4, 4]),
        "k1": Fake([1.0, 0.6, 0.6, 0.01], [1, 1, 1, 0], [4, 4, 4, 1]),  # the last round: one row left
        "k2": Fake([1.0, 0.75, 0.75], [2, 2, 2], [4, 4, 4]),
        "k3": Fake([1.0, 0.8, 0.2], [3, 3, 3], [4, 4, 2]),
    }
    (cost,) = measure_batch_costs(timers, 12, [4], repeats=1).costs
    assert math.isclose(cost.round_s, 0.5) and math.isclose(cost.c, 0.2)
    assert cost.drafted_s == (0.6, 0.75, 0.8)  # the round gate's prices: 1.2, 1.5, 1.6 AR rounds
