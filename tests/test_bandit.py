"""BanditSpec selectors (DESIGN §7): UCBSpec's radius and behaviour, EXP3Spec's update, regret growth."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from acchead.errors import AccheadError
from acchead.head import AcceptanceHead
from acchead.inference.bandit import EXP3Spec, UCBSpec, make_selector
from acchead.inference.bandit_decoder import bandit_decoder
from acchead.inference.bandit_policy import BanditPolicy
from acchead.inference.decoder import SpeculativeDecoder
from acchead.inference.mag import build_bigram_table
from acchead.inference.policy_build import parse_policy

L = 8  # longest speculation: rewards in [1, 9]


def _play(selector, means: list[float], rounds: int, seed: int) -> tuple[np.ndarray, float]:
    """Run a synthetic stochastic bandit; returns (pull counts, pseudo-regret vs the best arm).

    Arm i's reward is 1 + Binomial(L, means[i] / L): integer, in [1, L + 1], mean 1 + means[i].
    """
    rng = np.random.default_rng(seed)
    regret = 0.0
    for _ in range(rounds):
        arm = selector.select()
        y = 1 + rng.binomial(L, means[arm] / L)
        selector.update(arm, float(y))
        regret += max(means) - means[arm]
    return selector.pulls.copy(), regret


def test_ucb_radius_matches_formula():
    ucb = UCBSpec(num_arms=3, max_len=L, delta=0.5)
    for arm, y in [(0, 3.0), (1, 5.0), (2, 1.0), (0, 4.0)]:
        ucb.update(arm, y)
    t = ucb.t + 1  # the round about to be chosen
    for i, n in enumerate([2, 1, 1]):
        want = (L / 2) * math.sqrt((1 + n) / n**2 * (1 + 2 * math.log(3 * t**2 * math.sqrt(1 + n) / 0.5)))
        assert ucb.radius()[i] == pytest.approx(want, rel=1e-12)
    assert ucb.means().tolist() == [3.5, 5.0, 1.0]


def test_ucb_pulls_each_arm_once_then_concentrates():
    means = [2.0, 3.0, 6.0, 4.0]  # arm 2 is best by a clear gap
    ucb = UCBSpec(num_arms=4, max_len=L)
    first = []
    for _ in range(4):
        arm = ucb.select()
        first.append(arm)
        ucb.update(arm, 1.0 + means[arm])
    assert first == [0, 1, 2, 3]
    pulls, _ = _play(ucb, means, rounds=4000, seed=0)
    # The paper's radius is wide (L/2 scale), so exploration is generous; the best arm still dominates.
    assert pulls[2] > 0.85 * pulls.sum()
    assert pulls[2] > 3 * max(pulls[0], pulls[1], pulls[3])
    assert pulls[0] < pulls[1] < pulls[3]  # worse arms are pulled less


def test_exp3_probabilities_and_update_by_hand():
    exp3 = EXP3Spec(num_arms=3, max_len=L, seed=1)
    p1 = exp3.probabilities()
    np.testing.assert_allclose(p1, [1 / 3] * 3)
    arm = exp3.select()
    exp3.update(arm, 3.0)  # loss (L + 1 − y) / L = 6/8, weighted by 1/p = 3
    want_s = np.zeros(3)
    want_s[arm] = (L + 1 - 3.0) / (L * (1 / 3))
    np.testing.assert_allclose(exp3.loss_sum, want_s)
    eta2 = math.sqrt(math.log(3) / (2 * 3))
    assert exp3.learning_rate() == pytest.approx(eta2)
    w = np.exp(-eta2 * want_s)
    p2 = exp3.probabilities()
    np.testing.assert_allclose(p2, w / w.sum())
    assert p2.sum() == pytest.approx(1.0) and (p2 > 0).all() and p2[arm] < 1 / 3

    # Later rounds: the weight is 1/p of the probability the arm was drawn with (before the update).
    arm2 = exp3.select()
    before = exp3.loss_sum.copy()
    exp3.update(arm2, float(L + 1))  # a perfect round has zero loss
    np.testing.assert_allclose(exp3.loss_sum, before)
    p3 = exp3.probabilities()
    arm3 = exp3.select()
    exp3.update(arm3, 1.0)  # worst round: loss 1
    assert exp3.loss_sum[arm3] - before[arm3] == pytest.approx(1 / p3[arm3])


def test_exp3_is_seeded_and_prefers_the_best_arm():
    means = [1.0, 5.0, 2.0]
    a, _ = _play(EXP3Spec(3, L, seed=7), means, rounds=1500, seed=3)
    b, _ = _play(EXP3Spec(3, L, seed=7), means, rounds=1500, seed=3)
    assert a.tolist() == b.tolist()
    assert a[1] > 0.8 * a.sum()


@pytest.mark.parametrize("kind", ["ucb", "exp3"])
def test_regret_grows_sublinearly(kind):
    means = [2.0, 4.5, 3.0]
    regrets = {}
    for rounds in (500, 4000):
        r = [_play(make_selector(kind, 3, L, seed=s), means, rounds, seed=100 + s)[1] for s in range(3)]
        regrets[rounds] = float(np.mean(r))
    # Linear regret would grow 8×; the bounds are O(sqrt(T log T)) (EXP3) and O(log T) (UCB).
    assert regrets[4000] < 4.0 * regrets[500]
    # and far below always playing the worst arm
    assert regrets[4000] < 0.5 * (max(means) - min(means)) * 4000


def test_rate_reward_and_bad_input():
    ucb = UCBSpec(2, L, reward="rate")
    ucb.update(0, 120.0)
    ucb.update(1, 60.0)
    assert ucb.select() == 0  # equal pulls → equal radius → higher mean wins
    with pytest.raises(AccheadError):
        UCBSpec(0, L)
    with pytest.raises(AccheadError):
        UCBSpec(2, L, delta=1.5)
    with pytest.raises(AccheadError):
        make_selector("thompson", 2, L)
    with pytest.raises(ValueError):
        UCBSpec(2, L).update(0, L + 2.0)  # a token reward above L + 1 is a caller bug


# ------------------------------------------------------------------------------- as a decoding policy


def _greedy(model, prompt: torch.Tensor, n: int) -> list[int]:
    out = model.generate(prompt[None], max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, prompt.numel():].tolist()


def test_parse_bandit_spec_round_trip_and_errors():
    p = parse_policy("ucb:arms=specdec:k=2|specdec:k=4|confidence:tau=0.4,max=8|autoregressive")
    assert isinstance(p, BanditPolicy) and isinstance(p.start_decode().selector, UCBSpec)
    want = ["specdec:k=2", "specdec:k=4", "confidence:tau=0.4,max=8", "autoregressive"]
    assert [a.spec for a in p.arms] == want
    assert p.max_len == 8
    again = parse_policy(p.spec)
    assert again.spec == p.spec
    e = parse_policy("exp3:seed=3,reward=rate,carry=1,arms=specdec:k=1|specdec:k=3")
    assert isinstance(e.start_decode().selector, EXP3Spec) and e.seed == 3 and e.carry
    for bad in ("ucb:specdec:k=2", "ucb:arms=", "ucb:seed=1,arms=specdec:k=2", "ucb:arms=oracle",
                "ucb:arms=specdec:k=0", "exp3:seed=x,arms=specdec:k=2"):
        with pytest.raises(AccheadError):
            parse_policy(bad)


def test_end_round_feeds_accepted_plus_one():
    p = parse_policy("ucb:arms=specdec:k=2|specdec:k=5").start_decode()  # the decode's bandit state
    assert p.start_round(0) == 2  # warm-up pulls arm 0 first
    p.end_round(drafted=2, accepted=1)
    assert p.start_round(3) == 5
    p.end_round(drafted=5, accepted=5)
    assert p.selector.reward_sum.tolist() == [2.0, 6.0] and p.history == [0, 1]
    assert p.pull_counts() == {"specdec:k=2": 1, "specdec:k=5": 1}


@pytest.mark.parametrize("kind", ["ucb", "exp3"])
def test_bandit_decoding_equals_target_greedy(tiny_llama_pair, kind):
    target, draft = tiny_llama_pair
    head = AcceptanceHead(draft.config.hidden_size, depth=2)
    # Arms with different needs: a head policy (hidden states, free token), fixed K, no drafting.
    arms = "specdec:k=1|specdec:k=3|specdecpp:h=0.5,max=4|autoregressive"
    dec = SpeculativeDecoder(target, draft, policy=f"{kind}:arms={arms}", head=head)
    prompt = torch.tensor([5, 17, 40, 99, 3, 250, 7])
    res = dec.generate(prompt, max_new_tokens=30, temperature=0)
    assert res.new_ids.tolist() == _greedy(target, prompt, 30)
    pulls = dec.policy_run.selector.pulls
    assert pulls.sum() == res.rounds == len(dec.policy_run.history)
    if kind == "ucb":
        assert (pulls >= 1).all()  # warm-up: every arm once
    # Statistics reset per prompt (the paper's setting): a second call starts from scratch.
    res2 = dec.generate(prompt, max_new_tokens=30, temperature=0)
    assert dec.policy_run.selector.pulls.sum() == res2.rounds


def test_bandit_carry_continues_the_last_decodes_statistics(tiny_llama_pair):
    """carry=1: a decode's run continues the previous decode's selector; the policy itself never changes."""
    target, draft = tiny_llama_pair
    dec = SpeculativeDecoder(target, draft, policy="ucb:carry=1,arms=specdec:k=1|specdec:k=3")
    prompt = torch.tensor([5, 17, 40, 99])
    first = dec.generate(prompt, max_new_tokens=12, temperature=0)
    run = dec.policy_run
    second = dec.generate(prompt, max_new_tokens=12, temperature=0)
    assert dec.policy_run is not run and dec.policy_run.selector is run.selector
    assert dec.policy_run.selector.pulls.sum() == first.rounds + second.rounds
    assert len(dec.policy_run.history) == second.rounds


def test_bandit_over_drafters_equals_target_greedy(tiny_llama_pair):
    """Arms that switch drafter per round (draft model, MaG, a cascade) keep greedy decoding exact."""
    target, draft = tiny_llama_pair
    vocab = target.config.vocab_size
    bigram = build_bigram_table([np.random.default_rng(0).integers(0, vocab, 300)], vocab)
    spec = "ucb:arms=specdec:k=2|mag:block=6@specdec:k=6|cascade:k=3.1/4@specdec:k=4"
    dec = bandit_decoder(target, draft, spec, bigram=bigram)
    prompt = torch.tensor([5, 17, 40, 5, 17, 40, 5])
    res = dec.generate(prompt, max_new_tokens=30, temperature=0)
    assert res.new_ids.tolist() == _greedy(target, prompt, 30)
    counts = dec.policy_run.pull_counts()
    assert list(counts) == ["specdec:k=2", "mag:block=6@specdec:k=6", "cascade:k=3.1/4@specdec:k=4"]
    assert all(n >= 1 for n in counts.values()) and sum(counts.values()) == res.rounds
    with pytest.raises(AccheadError):
        parse_policy(spec)  # drafter arms need the factory, which builds the drafters
    with pytest.raises(AccheadError):
        bandit_decoder(target, draft, spec)  # no bigram table for MaG
