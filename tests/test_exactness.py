"""Exactness of the speculative decoders: every policy × verifier samples exactly from the target.

1. Exact enumeration on a toy vocabulary: p and q are python functions of the context (with contexts
   where q = 0 where p > 0, q one-hot, q = p, and p = 0 somewhere). Every random outcome of a short
   generation — the draft's samples, each accept/reject branch, each residual sample — is enumerated with
   its probability, running the decoder's own `draft_round` (with a scripted drafter) and the verifiers'
   own branch functions; the result must equal the target's autoregressive distribution (TV < 1e-9).
   Deliberately wrong verifiers are the negative controls. Adaptive policies (AdaEDL's online λ) are also
   enumerated with each branch's own round feedback (`decoded_dist(..., feedback=True)`).
2. Chi-square of decoded sequences from tiny random Llamas against their exact target distribution, and
   greedy decoding token-for-token `transformers.generate(do_sample=False)`: `test_exactness_models.py`;
   the verifiers' laws themselves: `test_verification_laws.py`.
"""

from __future__ import annotations

import copy
import itertools
import math
import random
from collections import defaultdict
from collections.abc import Callable
from typing import ClassVar

import pytest
import torch

from acchead.head import AcceptanceHead
from acchead.inference import parse_policy
from acchead.inference.adaedl import AdaEDL, AdaEDLRun
from acchead.inference.draft_round import draft_round
from acchead.inference.drafters import Drafter, DraftStep
from acchead.inference.policies import PolicyRun, StopPolicy
from acchead.inference.verification import (
    block_h,
    block_next_dist,
    block_tau_probs,
    token_next_dist,
    token_tau_probs,
)

# ------------------------------------------------------------------------------------------- toy world

PROMPT = (1,)
HIDDEN = 4


def _rng(ctx: tuple[int, ...], salt: str) -> random.Random:
    return random.Random(f"{salt}:{ctx}")


def _normalise(w: list[float]) -> list[float]:
    s = sum(w)
    return [x / s for x in w]


def toy_p(ctx: tuple[int, ...], vocab: int) -> list[float]:
    """Target: a context-dependent distribution; in a third of the contexts some token has p = 0."""
    r = _rng(ctx, "p")
    w = [r.random() ** 2 + 0.01 for _ in range(vocab)]
    if r.random() < 1 / 3:
        w[r.randrange(vocab)] = 0.0
    return _normalise(w)


def _kind(ctx: tuple[int, ...]) -> int:
    """0: q = p, 1: one-hot q, 2: q = 0 at p's mode, 3: unrelated q (half the contexts: the generic case)."""
    return _rng(ctx, "kind").choice([0, 1, 2, 3, 3, 3])


def toy_q(ctx: tuple[int, ...], vocab: int) -> list[float]:
    """Draft: per context one of four kinds: q = p, one-hot, q = 0 where p > 0, or unrelated."""
    kind = _kind(ctx)
    r = _rng(ctx, "q")
    if kind == 0:
        return toy_p(ctx, vocab)
    if kind == 1:
        w = [0.0] * vocab
        w[r.randrange(vocab)] = 1.0
        return w
    w = [r.random() + 0.05 for _ in range(vocab)]
    if kind == 2:
        p = toy_p(ctx, vocab)
        w[max(range(vocab), key=lambda i: p[i])] = 0.0  # the target's favourite is never drafted
    return _normalise(w)


def one_hot_argmax(dist: list[float]) -> list[float]:
    out = [0.0] * len(dist)
    out[max(range(len(dist)), key=lambda i: dist[i])] = 1.0
    return out


class World:
    """A toy target/draft pair: `p(ctx)`, `q(ctx)` as float64 tensors, a hidden feature for the head."""

    def __init__(self, vocab: int, length: int, eos: set[int], greedy: bool = False) -> None:
        self.vocab, self.length, self.eos, self.greedy = vocab, length, eos, greedy

    def p(self, ctx: tuple[int, ...]) -> torch.Tensor:
        d = toy_p(ctx, self.vocab)
        return torch.tensor(one_hot_argmax(d) if self.greedy else d, dtype=torch.float64)

    def q(self, ctx: tuple[int, ...]) -> torch.Tensor:
        d = toy_q(ctx, self.vocab)
        return torch.tensor(one_hot_argmax(d) if self.greedy else d, dtype=torch.float64)

    @staticmethod
    def hidden(ctx: tuple[int, ...]) -> torch.Tensor:
        r = _rng(ctx, "e")
        return torch.tensor([r.gauss(0, 2) for _ in range(HIDDEN)])

    def target_dist(self) -> dict[tuple[int, ...], float]:
        """The target's exact distribution over generated sequences (EOS or `length` ends them)."""
        out: dict[tuple[int, ...], float] = defaultdict(float)

        def rec(gen: tuple[int, ...], prob: float) -> None:
            if len(gen) == self.length or (gen and gen[-1] in self.eos):
                out[gen] += prob
                return
            for x, px in enumerate(self.p(PROMPT + gen).tolist()):
                if px > 0:
                    rec((*gen, x), prob * px)

        rec((), 1.0)
        return out

    def agreement(self) -> list[list[bool]]:
        """The oracle's hindsight in a greedy world (one level: the draft's candidates do not depend on their
        depth): draft argmax == target argmax along the output."""
        gen: tuple[int, ...] = ()
        agree = []
        while len(gen) < self.length and not (gen and gen[-1] in self.eos):
            x = int(self.p(PROMPT + gen).argmax())
            agree.append(int(self.q(PROMPT + gen).argmax()) == x)
            gen = (*gen, x)
        return [agree]


class ScriptedDrafter(Drafter):
    """Proposes script[k-1] as candidate k (with the toy q of its context): enumerating all scripts
    enumerates all draft samples."""

    def __init__(self, world: World, script: tuple[int, ...]) -> None:
        self.world, self.script = world, script
        self.draft_calls = 0

    def begin(self, input_ids, sampling, seed) -> None:
        pass

    def propose(
        self, context: torch.Tensor, index: int, want_hidden: bool, want_state: bool = False, judge=None
    ) -> DraftStep:
        ctx = tuple(context.tolist())
        token = self.script[index - 1]
        hidden = self.world.hidden((*ctx, token)) if want_hidden else None
        state = self.world.hidden(ctx) if want_state else None
        return DraftStep(token=token, q=self.world.q(ctx), hidden=hidden, index=index, state=state)

    def rollback(self, length: int) -> None:
        pass


TauFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
NextFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]


def round_outcomes(world: World, policy: PolicyRun, gen: tuple[int, ...]):
    """[(drafted tokens, probability, q (L, V))] of one round after `gen`, via the decoder's draft_round;
    `policy`: the decode's run of the policy (`StopPolicy.start_decode`)."""
    ctx = PROMPT + gen
    cap = min(policy.start_round(len(gen)), world.length - len(gen) - 1)
    if cap <= 0:
        return [((), 1.0, torch.zeros(0, world.vocab, dtype=torch.float64))]
    outcomes = {}
    for script in itertools.product(range(world.vocab), repeat=cap):
        policy.start_round(len(gen))
        seq = torch.tensor(ctx + (0,) * (cap + 1))
        steps = draft_round(ScriptedDrafter(world, script), policy, seq, len(ctx), cap)
        drafted = tuple(s.token for s in steps)
        prob = math.prod(float(s.q[s.token]) for s in steps)
        if prob > 0 and drafted not in outcomes:  # scripts that share the drafted prefix: one outcome
            outcomes[drafted] = (drafted, prob, torch.stack([s.q for s in steps]))
    assert abs(sum(o[1] for o in outcomes.values()) - 1) < 1e-12, "round outcomes must form a distribution"
    return list(outcomes.values())


def decoded_dist(world: World, policy: StopPolicy, tau_fn: TauFn, next_fn: NextFn, feedback: bool = False):
    """Exact distribution of the decoder's output: enumerate rounds, accept counts and next tokens.

    `feedback=True` also gives the policy each round's outcome, as the decoder does: every branch
    (drafted block, accept count τ) continues with its own copy of the decode's policy state (its run)
    after `end_round(len(drafted), τ)`, so a policy whose state adapts (AdaEDL's λ) is enumerated with the
    state each history would give it.
    """
    run = policy.start_decode(reference=world.agreement() if policy.needs_reference else None)
    out: dict[tuple[int, ...], float] = defaultdict(float)

    def rec(gen: tuple[int, ...], prob: float, pol: PolicyRun) -> None:
        if len(gen) == world.length or (gen and gen[-1] in world.eos):
            out[gen] += prob
            return
        for drafted, p_draft, q in round_outcomes(world, pol, gen):
            ctx = PROMPT + gen
            p = torch.stack([world.p(ctx + drafted[:i]) for i in range(len(drafted) + 1)])
            tokens = torch.tensor(drafted, dtype=torch.long)
            for tau, p_tau in enumerate(tau_fn(tokens, q, p).tolist()):
                if p_tau <= 0:
                    continue
                after = pol
                if feedback:
                    after = copy.deepcopy(pol)
                    after.end_round(len(drafted), tau)
                for x, px in enumerate(next_fn(tokens, q, p, tau).tolist()):
                    if px <= 0:
                        continue
                    new = (*drafted[:tau], x)
                    cut = next((i for i, t in enumerate(new) if t in world.eos), None)
                    rec(gen + (new if cut is None else new[: cut + 1]), prob * p_draft * p_tau * px, after)

    rec((), 1.0, run)
    return out


def tv(a: dict, b: dict) -> float:
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


def toy_head() -> AcceptanceHead:
    """A fixed random head whose predictions spread over (0, 1) on the toy features."""
    torch.manual_seed(0)
    head = AcceptanceHead(HIDDEN, depth=1)
    return head


VERIFIERS = {"token": (token_tau_probs, token_next_dist), "block": (block_tau_probs, block_next_dist)}
SAMPLING_POLICIES = [
    "autoregressive",
    "specdec:k=1",
    "specdec:k=3",
    "specdecpp:h=0.3,max=3",
    "specdecpp:h=0.6,max=3,free=0",
    "confidence:tau=0.5,max=3",
    "entropy:tau=0.5,max=3",  # stops after a candidate drawn from q with H(q) > 0.5 nats
    "adaedl:lam=0.6,max=3",  # stops iff H(q) > 0.8 (λ only moves with feedback: see below)
    "adaedl:gamma=0.5,lam=0.3,adapt=0,max=3",  # stops iff H(q) > 0.98
]
WORLDS = {
    "V3-len4": World(vocab=3, length=4, eos=set()),
    "V4-len3-eos": World(vocab=4, length=3, eos={3}),
}


# --------------------------------------------------------------------------------- enumeration tests


def test_toy_world_has_every_case():
    """The contexts the enumeration visits include q = p, one-hot q, q = 0 < p, and p = 0."""
    ctxs = [PROMPT + g for n in range(3) for g in itertools.product(range(3), repeat=n)]
    kinds = {_kind(c) for c in ctxs}
    assert kinds == {0, 1, 2, 3}
    assert any(0.0 in toy_p(c, 3) for c in ctxs)


@pytest.mark.parametrize("world", list(WORLDS), ids=str)
@pytest.mark.parametrize("verifier", list(VERIFIERS))
@pytest.mark.parametrize("spec", SAMPLING_POLICIES)
def test_enumeration_exact(spec, verifier, world):
    w = WORLDS[world]
    policy = parse_policy(spec, head=toy_head())
    got = decoded_dist(w, policy, *VERIFIERS[verifier])
    assert abs(sum(got.values()) - 1) < 1e-12
    assert tv(got, w.target_dist()) < 1e-9


@pytest.mark.parametrize("verifier", list(VERIFIERS))
@pytest.mark.parametrize("spec", [*SAMPLING_POLICIES, "oracle", "oracle:max=1"])
def test_enumeration_greedy_is_the_target_argmax_path(spec, verifier):
    w = World(vocab=4, length=4, eos=set(), greedy=True)
    got = decoded_dist(w, parse_policy(spec, head=toy_head()), *VERIFIERS[verifier])
    target = w.target_dist()
    assert len(target) == 1 and tv(got, target) < 1e-12


class _RecordingAdaEDL(AdaEDL):
    """AdaEDL that records every λ it makes a stop decision with (tests give it exaggerated steps)."""

    seen: ClassVar[set[float]] = set()  # shared by the per-branch deep copies

    def should_stop(self, run: PolicyRun, step: DraftStep) -> bool:
        assert isinstance(run, AdaEDLRun)
        type(self).seen.add(round(run.lam, 9))
        return super().should_stop(run, step)


# Long enough for rounds with stop decisions (cap >= 2) after a first round with feedback.
FEEDBACK_WORLDS = {"V3-len4": WORLDS["V3-len4"], "V2-len6-eos": World(vocab=2, length=6, eos={1})}


@pytest.mark.parametrize("world", list(FEEDBACK_WORLDS), ids=str)
@pytest.mark.parametrize("verifier", list(VERIFIERS))
def test_enumeration_exact_with_adaptive_state(verifier, world):
    """AdaEDL's online λ, fed each branch's own history of (drafted, accepted), keeps the output exact:
    its state is a function of finished rounds only. The λ values seen show that the state really moved
    and took part in the stop decisions."""
    w = FEEDBACK_WORLDS[world]
    _RecordingAdaEDL.seen = set()
    # γ = 0.5: λ = 0.6 stops iff H > 0.32 nats, λ = 0.9 iff H > 0.02, λ = 0.3 iff H > 0.98 (λ ±0.3 a round).
    policy = _RecordingAdaEDL(lam=0.6, gamma=0.5, max_draft=3, eps=0.3, beta2=0.0)
    got = decoded_dist(w, policy, *VERIFIERS[verifier], feedback=True)
    assert abs(sum(got.values()) - 1) < 1e-12
    assert tv(got, w.target_dist()) < 1e-9
    assert len(_RecordingAdaEDL.seen) >= 2, _RecordingAdaEDL.seen  # λ₀ and at least one moved λ


def _block_unscaled_residual(tokens, q, p, tau):
    """WRONG: block verification with token verification's residual max(p − q, 0) (not scaled by ρ_τ)."""
    if tau == tokens.numel():
        return p[tau]
    r = (p[tau] - q[tau]).clamp_min(0)
    return r / r.sum() if r.sum() > 0 else p[tau]


def _token_ignore_rejection(tokens, q, p, tau):
    """WRONG: after a rejection sample the target p itself instead of the residual."""
    return p[tau]


def _token_first_failure_block(tokens, q, p):
    """WRONG: block verification's h, but stopping at the first failure (token-style scan)."""
    h = block_h(tokens, q, p)[1:]
    survive = torch.cat([h.new_ones(1), torch.cumprod(h, 0)])
    return survive * torch.cat([1 - h, h.new_ones(1)])


@pytest.mark.parametrize(
    "wrong",
    [
        (block_tau_probs, _block_unscaled_residual),
        (token_tau_probs, _token_ignore_rejection),
        (_token_first_failure_block, block_next_dist),
    ],
    ids=["block-unscaled-residual", "token-ignore-rejection", "block-first-failure"],
)
def test_enumeration_catches_wrong_verifiers(wrong):
    """Negative controls: the same harness must see these bugs (they are off by far more than 1e-9)."""
    w = WORLDS["V3-len4"]
    got = decoded_dist(w, parse_policy("specdec:k=3"), *wrong)
    assert tv(got, w.target_dist()) > 1e-4
