"""A batch of one prompt runs on the single-prompt decoder (`acchead.inference.batched_single`): the same
tokens, rounds and forwards as the batched rounds at B = 1 (`single=False`), greedy and sampled, for every
batchable policy, on both paths; under the batch rule, the single-prompt threshold h' = min(h, 1 − c(1))
decides exactly what the rule decides for one row.
"""

from __future__ import annotations

import pytest
import torch
from exact_models import _peaked_llama, _perturbed
from test_batched import _heads

from acchead.inference.batch_cost import BatchCost, BatchCosts, measured_costs
from acchead.inference.batch_stop import BatchStop
from acchead.inference.batched import BatchedDecoder
from acchead.inference.batched_single import H_MIN, single_threshold
from acchead.inference.specdecpp_policy import SpecDecPP

PROMPT = [3, 5, 7, 9, 11, 2, 6]


@pytest.fixture(scope="module")
def pair():
    target = _peaked_llama(12, seed=3)
    return target, _perturbed(target, 0.5, seed=4)


def _decoder(pair, spec: str, kind: str | None, **kw) -> BatchedDecoder:
    target, draft = pair
    head = _heads(draft.config.hidden_size)[kind] if kind else None
    return BatchedDecoder(target, None if spec == "autoregressive" else draft, spec, head=head, **kw)


def _same_decode(one, batched) -> None:
    """The two results' tokens, rounds and forwards are equal."""
    a, b = one.rows[0], batched.rows[0]
    assert a.new_ids.tolist() == b.new_ids.tolist()
    assert a.drafted_per_round == b.drafted_per_round and a.accepted_per_round == b.accepted_per_round
    assert (one.target_calls, one.draft_calls) == (batched.target_calls, batched.draft_calls)


CASES = [
    ("autoregressive", None),
    ("specdec:k=3", None),
    ("specdecpp:h=0.5,max=6", "candidate"),
    ("specdecpp:h=0.6,max=6", "lookahead"),
    ("adaedl:lam=0.6,max=6", None),
]


@pytest.mark.parametrize("fast", [False, True], ids=["eager", "fast"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize(("spec", "kind"), CASES, ids=lambda x: str(x))
def test_a_batch_of_one_decodes_what_the_batched_rounds_decode(pair, spec, kind, temperature, fast):
    """Dispatched to the single-prompt decoder (its rounds are not the batched loop's: no per-round times),
    a batch of one decodes what the batched rounds decode for it, draws and round lengths included (the
    fast path's static caches run eagerly here: `compile=False`)."""
    one = _decoder(pair, spec, kind, fast=fast, compile=False)
    rounds = _decoder(pair, spec, kind, fast=fast, compile=False, single=False)
    assert one.warm_up(1, len(PROMPT) + 24, temperature) >= 0.0
    args = {"max_new_tokens": 24, "temperature": temperature, "seed": 5}
    res, ref = one.generate([PROMPT], **args), rounds.generate([PROMPT], **args)
    assert res.round_times == [] and len(ref.round_times) == ref.target_calls  # the two paths did run
    _same_decode(res, ref)
    assert res.wall_time > 0 and res.tokens == 24


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("kind", ["candidate", "lookahead"])
def test_the_batch_rule_of_one_row_is_the_threshold_h_prime(pair, kind, temperature):
    """With c(1) = 0.5 above 1 − h = 0.2 the batch rule ends rounds the row's own threshold would not; the
    single-prompt decoder at h' = 0.5 ends the same rounds."""
    spec = "specdecpp:h=0.8,max=8"
    one = _decoder(pair, spec, kind, batch_stop=0.5)
    rounds = _decoder(pair, spec, kind, batch_stop=0.5, single=False)
    args = {"max_new_tokens": 32, "temperature": temperature, "seed": 2}
    res, ref = one.generate([PROMPT], **args), rounds.generate([PROMPT], **args)
    assert ref.batch_stops > 0  # the rule did end rounds of the batched loop
    _same_decode(res, ref)
    assert one._single.decoder(one.batch_stop).policy.h == 0.5


def test_a_measured_rule_times_c1_on_the_single_prompt_rounds(pair):
    """A measured rule at B = 1 calibrates c(1) on the rounds of the single-prompt decoder (profiled timers:
    the path a batch of one takes), then decodes there at h' = min(h, 1 − c(1))."""
    dec = _decoder(pair, "specdecpp:h=0.6,max=6", "lookahead", batch_stop="measured")
    res = dec.generate([PROMPT], max_new_tokens=12, temperature=0)
    costs = dec.batch_stop.costs
    assert costs is not None and [c.batch for c in costs.costs] == [1]
    assert list(measured_costs(*pair, "eager+single")) == [1] and not measured_costs(*pair, "eager")
    c1 = dec.batch_stop.ratio(1)
    assert dec._single.decoder(dec.batch_stop).policy.h == pytest.approx(max(min(0.6, 1 - c1), H_MIN))
    assert res.rows[0].tokens == 12


def test_single_threshold_hand_computed(pair):
    head = _heads(pair[1].config.hidden_size)["lookahead"]
    policy = SpecDecPP(head, 0.8)
    assert single_threshold(policy, None) == 0.8
    assert single_threshold(policy, BatchStop(0.5)) == pytest.approx(0.5)  # 1 − h' = max(0.2, 0.5)
    assert single_threshold(policy, BatchStop(0.1)) == pytest.approx(0.8)  # the row's own h binds
    assert single_threshold(policy, BatchStop.from_h(0.8)) == pytest.approx(0.8)  # c = 1 − h adds nothing
    costly = BatchStop(costs=BatchCosts((BatchCost(batch=1, step_s=2.0, round_s=1.5),)))  # c(1) = 4/3
    assert single_threshold(policy, costly) == H_MIN  # every judged candidate ends its round


def test_rows_of_a_larger_batch_do_not_take_the_single_path(pair):
    """Two prompts run the batched rounds (per-round times); each row decodes what it decodes alone."""
    dec = _decoder(pair, "specdec:k=3", None)
    res = dec.generate([PROMPT, [1, 4]], max_new_tokens=10, temperature=0)
    assert len(res.round_times) == res.target_calls > 0
    alone = dec.generate([PROMPT], max_new_tokens=10, temperature=0)
    assert res.rows[0].new_ids.tolist() == alone.rows[0].new_ids.tolist()
    assert torch.equal(res.rows[0].new_ids, alone.rows[0].new_ids)


def test_a_timer_times_each_round_of_the_single_prompt_decoder(pair):
    """`SingleRow.timer`: per-round seconds and draft forwards of the dispatched decode, as the batched
    rounds report them (`measure_batch_costs` fits c(1) on them)."""
    dec = _decoder(pair, "specdec:k=3", None)
    timer = dec._single.timer(dec.draft, dec.policy)
    dec._single = timer
    res = dec.generate([PROMPT], max_new_tokens=16, temperature=0)
    assert len(res.round_times) == len(res.round_draft_calls) == res.target_calls > 1
    assert sum(res.round_draft_calls) == res.draft_calls and min(res.round_times) > 0
    assert sum(res.round_times) <= res.wall_time
