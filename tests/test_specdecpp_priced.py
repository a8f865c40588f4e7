"""SpecDec++ with its threshold priced by the verification widths (acchead.inference.specdecpp_policy):
the thresholds, the stops they make, exactness, and the fast path handing its measured units over."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from acchead.errors import AccheadError
from acchead.head import AcceptanceHead
from acchead.inference.decoder import SpeculativeDecoder
from acchead.inference.policy_build import parse_policy
from acchead.inference.spec import parse_policy_spec
from acchead.inference.specdecpp_policy import SpecDecPP, priced_thresholds

# ms per count fed: flat up to 4 tokens, a step of 2 autoregressive steps to the next width (5-8 tokens)
STEP_MS = {1: 10.0, 2: 10.0, 3: 10.0, 4: 10.0, 5: 30.0, 6: 30.0, 7: 30.0, 8: 30.0}


def test_thresholds_add_the_price_of_a_wider_verification_to_one_minus_h():
    # a lookahead head (extra = 1): a stop after candidate k verifies k + 1 tokens, continuing k + 2
    c = priced_thresholds(0.9, STEP_MS, cap=6, extra=1)
    assert len(c) == 8
    assert c[3] == pytest.approx(0.1 + (30 - 10) / 10)  # 4 tokens -> 5: the step to the next width
    assert [c[k] for k in (0, 1, 2, 4, 5, 6)] == pytest.approx([0.1] * 6)  # within a width: the paper's
    assert c[7] == pytest.approx(0.1)  # past the timed counts: the paper's rule
    # a candidate head's free token verifies one more: the step comes a candidate earlier
    c = priced_thresholds(0.9, STEP_MS, cap=6, extra=2)
    assert c[2] == pytest.approx(2.1) and c[3] == pytest.approx(0.1)
    assert priced_thresholds(0.8, {}, cap=3, extra=1) == pytest.approx([0.2] * 5)  # nothing timed


def test_priced_spec_round_trips_and_names_itself():
    spec = parse_policy_spec("specdecpp:h=0.9,priced=1")
    assert spec.priced is True and spec.to_spec() == "specdecpp:h=0.9,priced=1"
    head = AcceptanceHead(8, depth=1, kind="lookahead", inputs=("state",))
    assert parse_policy("specdecpp:h=0.9,priced=1", head=head).spec == "specdecpp:h=0.9,max=20,priced=1"
    assert "priced" not in parse_policy("specdecpp:h=0.9", head=head).spec
    with pytest.raises(AccheadError):
        parse_policy_spec("specdecpp:h=0.9,priced=maybe")


def _confident(policy: SpecDecPP) -> SpecDecPP:
    """The policy with a head that accepts every candidate with σ(8) ≈ 0.9997: P̂ stays near 1."""
    policy.call.logit = lambda step: torch.tensor(8.0, device=step.token.device)
    return policy


def test_a_priced_rule_stops_before_a_dearer_width_and_decodes_the_target_exactly(tiny_llama_pair):
    """A confident head never stops the paper's rule before the cap; priced, it stops where a candidate would
    step into the dearer width (c_3 = 2.1 > P̂), and both decode the autoregressive tokens, greedy."""
    target, draft = tiny_llama_pair
    head = AcceptanceHead(draft.config.hidden_size, depth=1, kind="lookahead", inputs=("state",))
    prompt = torch.tensor([5, 17, 40, 99])
    ar = SpeculativeDecoder(target, draft, policy="autoregressive").generate(prompt, 20, temperature=0)
    lengths = {}
    for spec in ("specdecpp:h=0.9,max=6", "specdecpp:h=0.9,max=6,priced=1"):
        dec = SpeculativeDecoder(target, draft, policy=spec, head=head)
        policy = _confident(dec.policy)
        policy.price_widths(STEP_MS)  # as a fast path's warm-up would
        res = dec.generate(prompt, max_new_tokens=20, temperature=0)
        assert res.new_ids.tolist() == ar.new_ids.tolist()
        lengths[spec] = res.drafted_per_round
    plain, priced = lengths.values()
    assert max(plain) == 6 and max(priced) == 3  # priced: stops at 3 candidates, verified at 4 tokens
    thresholds = dec.policy.thresholds
    assert thresholds[3] == pytest.approx(2.1) and thresholds[1] == pytest.approx(0.1)


def test_an_unpriced_policy_keeps_the_papers_threshold():
    head = AcceptanceHead(8, depth=1, kind="lookahead", inputs=("state",))
    policy = parse_policy("specdecpp:h=0.75,max=4", head=head)
    policy.price_widths(STEP_MS)
    assert policy.thresholds == pytest.approx([0.25] * 6)


def test_the_fast_path_prices_a_priced_rule_with_its_measured_units_and_matches_eager(compiled_pair):
    """After `warm_up` the compiled path's priced thresholds are its verifier's timed units
    (`RoundVerifier.fed_ms`, one per count fed up to cap + 1); given the same thresholds the eager path stops
    the same rounds and both decode the same tokens. The thresholds are an input of the draft's compiled
    step: repricing compiles nothing."""
    target, draft = compiled_pair
    torch.manual_seed(0)
    head = AcceptanceHead(draft.config.hidden_size, depth=1, kind="lookahead", inputs=("state", "token"))
    torch.nn.init.constant_(head.out.bias, 1.0)
    spec = "specdecpp:h=0.5,max=3,priced=1"
    fast = SpeculativeDecoder(target, draft, policy=spec, head=head, fast=True)
    fast.warm_up(64, temperature=0.0)
    fed = fast._verifier.fed_ms()
    assert set(range(1, 5)) <= set(fed) and all(ms > 0 for ms in fed.values())
    assert fast.policy.thresholds == pytest.approx(priced_thresholds(0.5, fed, cap=3, extra=1))
    eager = SpeculativeDecoder(target, draft, policy=spec, head=head, fast=False)
    prompt = torch.tensor([5, 9, 17, 33, 2])
    for prices in (fed, STEP_MS):
        fast.policy.price_widths(prices)
        eager.policy.price_widths(prices)
        with torch.compiler.set_stance("fail_on_recompile"):
            got = fast.generate(prompt, max_new_tokens=24, temperature=0)
        want = eager.generate(prompt, max_new_tokens=24, temperature=0)
        assert got.new_ids.tolist() == want.new_ids.tolist()
        assert got.drafted_per_round == want.drafted_per_round
    assert not math.isnan(sum(fast.policy.thresholds))


def test_batched_decoding_refuses_a_priced_rule(tiny_llama_pair):
    from acchead.inference.batched import BatchedDecoder

    target, draft = tiny_llama_pair
    head = AcceptanceHead(draft.config.hidden_size, depth=1, kind="lookahead", inputs=("state",))
    with pytest.raises(AccheadError, match="priced"):
        BatchedDecoder(target, draft, policy="specdecpp:h=0.9,priced=1", head=head)


def test_a_priced_rule_without_timings_says_it_runs_the_papers_threshold_once(tiny_llama_pair):
    target, draft = tiny_llama_pair
    head = AcceptanceHead(draft.config.hidden_size, depth=1, kind="lookahead", inputs=("state",))
    dec = SpeculativeDecoder(target, draft, policy="specdecpp:h=0.9,max=4,priced=1", head=head)  # eager
    dec.warm_up(32)  # eager: times nothing
    prompt = torch.tensor([5, 17, 40, 99])
    with pytest.warns(UserWarning, match="paper's threshold 1 - h"):
        dec.generate(prompt, max_new_tokens=4, temperature=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dec.generate(prompt, max_new_tokens=4, temperature=0)  # once per policy
    assert dec.policy.thresholds == pytest.approx([0.1] * 6)
