"""The training-free entropy stop rules: `entropy:` and AdaEDL (its stop rule and its online λ update)."""

from __future__ import annotations

import math

import pytest
import torch

from acchead.errors import AccheadError
from acchead.inference import SpeculativeDecoder, parse_policy
from acchead.inference.adaedl import AdaEDL
from acchead.inference.drafters import DraftStep
from acchead.inference.policies import Entropy, StopPolicy, draft_entropy


def _step(q: list[float] | torch.Tensor, logits: torch.Tensor | None = None, index: int = 1) -> DraftStep:
    q = torch.as_tensor(q, dtype=torch.float32)
    return DraftStep(token=int(q.argmax()), q=q, hidden=None, index=index, logits=logits)


def _with_entropy(h: float, vocab: int = 64) -> DraftStep:
    """A step whose q has entropy h nats: a softmax of a scaled ramp, bisected on the scale."""
    ramp = torch.linspace(0, 1, vocab, dtype=torch.float64)
    lo, hi = 0.0, 1e4  # scale 0: uniform (ln V); large scale: nearly one-hot
    for _ in range(200):
        mid = (lo + hi) / 2
        ent = float(torch.special.entr(torch.softmax(mid * ramp, 0)).sum())
        lo, hi = (mid, hi) if ent > h else (lo, mid)
    return _step(torch.softmax(lo * ramp, 0).float())


# ------------------------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("spec", "cls", "canonical"),
    [
        ("entropy:tau=1.0", Entropy, "entropy:tau=1,max=20"),
        (" Entropy : tau = 0.25 , max = 6 ", Entropy, "entropy:tau=0.25,max=6"),
        ("adaedl:lam=0.5", AdaEDL, "adaedl:gamma=0.2,lam=0.5,adapt=1,max=20"),
        ("adaedl:gamma=0.3,lam=0.7,adapt=0,max=8", AdaEDL, "adaedl:gamma=0.3,lam=0.7,adapt=0,max=8"),
        ("adaedl:lam=0,adapt=false", AdaEDL, "adaedl:gamma=0.2,lam=0,adapt=0,max=20"),
    ],
)
def test_parse_roundtrip(spec, cls, canonical):
    policy = parse_policy(spec)
    assert isinstance(policy, cls) and policy.spec == canonical
    assert parse_policy(policy.spec).spec == canonical


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("entropy", "needs tau"),
        ("entropy:tau=-0.1", "tau >= 0"),
        ("entropy:tau=inf", "finite tau"),
        ("entropy:tau=1,max=0", "1 <= max <= 1024"),
        ("entropy:tau=1,lam=2", "takes max, tau"),
        ("adaedl:gamma=0.2", "needs lam"),
        ("adaedl:lam=1.5", "0 <= lam <= 1"),
        ("adaedl:lam=0.5,gamma=0", "gamma > 0"),
        ("adaedl:lam=0.5,adapt=2", "not 0/1"),
        ("adaedl:lam=0.5,max=0", "1 <= max <= 1024"),
        ("adaedl:lam=x", "is not float"),
        ("specdecpp:max=99999999999", "1 <= max <= 1024"),  # allocated (max + 2,) state: 800 GB, a traceback
        ("specdec:k=100000", "1 <= k <= 1024"),
    ],
)
def test_parse_errors_are_one_line(spec, message):
    with pytest.raises(AccheadError, match=message) as e:
        parse_policy(spec)
    assert "\n" not in str(e.value)


# ------------------------------------------------------------------------------------------ stop rules


def test_draft_entropy_reads_q_or_the_greedy_softmax():
    v = 16
    assert draft_entropy(_step([1 / v] * v)) == pytest.approx(math.log(v))
    one_hot = [0.0] * v
    one_hot[3] = 1.0
    assert draft_entropy(_step(one_hot)) == 0.0  # MaG / greedy q without logits: never uncertain
    # Greedy: q is one-hot, the logits carry the draft's real uncertainty (flat here: ln V).
    assert draft_entropy(_step(one_hot, logits=torch.zeros(v))) == pytest.approx(math.log(v))
    # Peaked logits stay finite (log_softmax, not log of an underflowed softmax).
    peaked = torch.full((v,), -1e4)
    peaked[0] = 0.0
    assert draft_entropy(_step(one_hot, logits=peaked)) == pytest.approx(0.0, abs=1e-6)
    # Top-k zeros in q contribute nothing.
    assert draft_entropy(_step([0.5, 0.5, 0.0, 0.0])) == pytest.approx(math.log(2))


def _stops(policy: StopPolicy, step: DraftStep) -> bool:
    """The policy's decision on `step` in the first round of a fresh decode."""
    run = policy.start_decode()
    run.start_round(0)
    return run.should_stop(step)


def test_entropy_rule_stops_after_an_uncertain_candidate():
    policy = Entropy(tau=1.0, max_draft=7)
    assert policy.start_decode().start_round(0) == 7
    assert _stops(policy, _with_entropy(1.01))
    assert not _stops(policy, _with_entropy(0.99))
    assert not _stops(Entropy(tau=0.0), _with_entropy(0.0))  # strict: H = tau keeps drafting


def test_adaedl_stop_rule_at_its_threshold():
    """Stop iff 1 − sqrt(γ·H) < λ, i.e. iff H > (1 − λ)² / γ."""
    policy = AdaEDL(lam=0.5, gamma=0.2, adapt=False)
    h_star = (1 - 0.5) ** 2 / 0.2  # 1.25 nats
    assert policy.lower_bound(h_star) == pytest.approx(0.5)
    assert _stops(policy, _with_entropy(h_star + 0.01))
    assert not _stops(policy, _with_entropy(h_star - 0.01))
    assert _stops(AdaEDL(lam=0.0), _with_entropy(5.0)) is False  # bound < 0 is never < λ = 0


@pytest.mark.parametrize(("lam", "gamma"), [(0.1, 0.2), (0.5, 0.2), (0.7, 0.2), (0.3, 0.05)])
def test_fixed_lambda_adaedl_is_an_entropy_threshold(lam, gamma):
    """With λ fixed, AdaEDL decides exactly as `entropy:tau=(1 − λ)²/γ` on any draft distribution."""
    ada, ent = AdaEDL(lam=lam, gamma=gamma, adapt=False), Entropy((1 - lam) ** 2 / gamma)
    g = torch.Generator().manual_seed(0)
    for scale in (0.3, 1.0, 3.0, 10.0):
        for _ in range(50):
            step = _step(torch.softmax(scale * torch.randn(128, generator=g), 0))
            assert _stops(ada, step) == _stops(ent, step)


# ----------------------------------------------------------------------------------------- λ update


def _algorithm1(lam, ar, drafted, accepted, cap, b1=0.5, b2=0.9, eps=0.01, alpha=0.9):
    """The paper's Algorithm 1, written out independently of the class."""
    ar = b1 * ar + (1 - b1) * accepted / drafted
    lam_p = lam + eps if ar < alpha else lam - eps if accepted != cap else lam
    return b2 * lam + (1 - b2) * lam_p, ar


def test_adaedl_lambda_update_by_hand():
    policy = AdaEDL(lam=0.5, max_draft=4).start_decode()  # λ and AR live in the decode's run
    assert (policy.lam, policy.ar) == (0.5, 0.9)  # AR starts at the target α
    policy.end_round(4, 1)  # AR = 0.5·0.9 + 0.5·0.25 = 0.575 < 0.9: λ up by (1 − β2)·ε
    assert policy.ar == pytest.approx(0.575) and policy.lam == pytest.approx(0.501)

    policy = AdaEDL(lam=0.5, max_draft=4).start_decode()
    policy.end_round(3, 3)  # AR = 0.95 ≥ 0.9 and n_acc = 3 ≠ L = 4: λ down
    assert policy.ar == pytest.approx(0.95) and policy.lam == pytest.approx(0.499)
    policy.end_round(4, 4)  # AR = 0.975, n_acc = L: λ unchanged
    assert policy.ar == pytest.approx(0.975) and policy.lam == pytest.approx(0.499)

    # A long random history matches the formula step for step.
    policy, lam, ar = AdaEDL(lam=0.3, max_draft=6).start_decode(), 0.3, 0.9
    g = torch.Generator().manual_seed(1)
    for _ in range(200):
        drafted = int(torch.randint(1, 7, (1,), generator=g))
        accepted = int(torch.randint(0, drafted + 1, (1,), generator=g))
        policy.end_round(drafted, accepted)
        lam, ar = _algorithm1(lam, ar, drafted, accepted, 6)
        assert (policy.lam, policy.ar) == pytest.approx((lam, ar))
    assert policy.lam != pytest.approx(0.3)


def test_adaedl_state_moves_only_from_finished_rounds():
    policy = AdaEDL(lam=0.5, max_draft=4).start_decode()
    policy.start_round(0)
    policy.should_stop(_with_entropy(3.0))  # decisions never touch the state
    assert (policy.lam, policy.ar) == (0.5, 0.9)
    policy.end_round(0, 0)  # no candidate (last token of a generation): no information
    assert (policy.lam, policy.ar) == (0.5, 0.9)
    fixed = AdaEDL(lam=0.5, adapt=False).start_decode()
    fixed.end_round(4, 0)
    assert (fixed.lam, fixed.ar) == (0.5, 0.9)


def test_adaedl_state_is_per_decode():
    policy = AdaEDL(lam=0.5, max_draft=4)
    run = policy.start_decode()
    run.start_round(0)
    run.end_round(4, 0)
    run.start_round(5)  # a later round of the same decode keeps the state
    assert run.lam > 0.5
    fresh = policy.start_decode()  # a new decode (prompt) starts from λ₀ and AR = α; the policy is unchanged
    assert (fresh.lam, fresh.ar) == (0.5, 0.9) and policy.lam0 == 0.5


def test_adaedl_adapts_inside_the_decoder(tiny_llama_pair):
    """The decoder feeds every round back: λ moves during a generation, and greedy stays exact."""
    target, draft = tiny_llama_pair
    prompt = torch.tensor([3, 7, 11, 5])
    policy = AdaEDL(lam=0.5, max_draft=6, eps=0.5, beta2=0.0)  # exaggerated steps, visible in 24 tokens
    dec = SpeculativeDecoder(target, draft, policy=policy)
    res = dec.generate(prompt, max_new_tokens=24, temperature=0)
    assert dec.policy_run.lam != 0.5 and res.rounds > 1
    ref = SpeculativeDecoder(target, None, policy="autoregressive").generate(prompt, 24, temperature=0)
    assert res.new_ids.tolist() == ref.new_ids.tolist()


def test_spec_module_alone_parses_bandit_specs_without_torch():
    # A fresh interpreter that imports only acchead.inference.spec: the registry names the bandit specs
    # explicitly (they used to register themselves when their module was imported), and parsing a spec
    # loads no torch (the CLIs check a spec before they load anything).
    import subprocess
    import sys

    code = ("import sys\n"
            "from acchead.inference.spec import parse_policy_spec\n"
            "p = parse_policy_spec('ucb:arms=specdec:k=2|specdec:k=4')\n"
            "print(type(p).__name__, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "UCBBanditSpec False"
