"""BanditSpec as a decoding policy (DESIGN §7): a selector picks each round's configuration.

Spec strings (the CLIs' `--policy`, also accepted by `parse_policy`):

    ucb:arms=specdec:k=2|specdec:k=4|specdecpp:h=0.8,max=20      UCBSpec over stop policies
    exp3:seed=0,arms=specdec:k=2|specdec:k=6                      EXP3Spec (its own seeded generator)
    ucb:reward=rate,arms=...                                      reward = tokens per wall second
    ucb:carry=1,arms=...                                          keep statistics across prompts
    ucb:arms=specdec:k=3|mag@specdec:k=8|cascade:k=4.2/10@specdec:k=6
                                                                  arms with their own drafters (build
                                                                  with `decoder.bandit_decoder`)

`arms=` comes last (arm specs contain commas). Each round, the chosen arm's policy (and drafter) runs the
round; the reward y = accepted + 1 goes back to the selector. Choices depend only on finished rounds, so
the output is exactly the target's (BanditSpec Prop. 3.1) — tests/test_bandit.py checks greedy equality.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from acchead.errors import AccheadError
from acchead.inference.bandit import RewardKind, make_selector
from acchead.inference.drafters import Drafter, DraftStep
from acchead.inference.policies import COMPOSITE_PARSERS, Autoregressive, FixedK, StopPolicy, parse_policy
from acchead.sampling import SamplingConfig


def max_speculation(policy: StopPolicy) -> int:
    """L of one arm: the most candidates it can draft in a round."""
    if isinstance(policy, Autoregressive):
        return 0
    if isinstance(policy, FixedK):
        return policy.k
    cap = getattr(policy, "max_draft", None)
    if cap is None:
        raise AccheadError(f"cannot bound the speculation length of arm {policy.spec!r}")
    return int(cap)


class BanditPolicy(StopPolicy):
    """A stop policy whose configuration is chosen per round by a BanditSpec selector.

    Each arm is a full stop policy (`specdec:k=4`, `specdecpp:h=0.8`, ...). `start_round` asks the selector
    for an arm and delegates the round to it; `end_round` feeds back y = accepted + 1 (or the round's
    tokens per wall second). The decoder reads `needs_hidden`/`free_token` after `start_round`, so arms
    with different needs mix freely.

    An arm may also name its own drafter (`mag@specdec:k=8`, `cascade:k=4.2/10@specdec:k=6`); such a
    bandit needs `acchead.inference.decoder.bandit_decoder`, which gives the decoder a `SwitchDrafter` over
    the arms' drafters.

    Args:
        arms: the candidate policies (no oracle: it needs hindsight).
        drafters: per arm, a drafter spec (`acchead.inference.cascade.make_drafter`) or None for the draft
            model.
        selector: "ucb" or "exp3".
        delta: UCBSpec's confidence parameter.
        seed: EXP3Spec's own generator seed (independent of token sampling).
        reward: "tokens" or "rate".
        carry: keep the statistics across `generate` calls (prompts); the paper resets per prompt.
    """

    def __init__(
        self,
        arms: list[StopPolicy],
        selector: str = "ucb",
        *,
        drafters: list[str | None] | None = None,
        delta: float = 0.5,
        seed: int = 0,
        reward: RewardKind = "tokens",
        carry: bool = False,
    ) -> None:
        if not arms:
            raise AccheadError("a bandit policy needs at least one arm")
        if any(a.greedy_only or a.needs_reference for a in arms):
            raise AccheadError("the oracle cannot be a bandit arm (it needs hindsight)")
        self.arms = arms
        self.drafters = list(drafters) if drafters is not None else [None] * len(arms)
        if len(self.drafters) != len(arms):
            raise AccheadError("one drafter entry per bandit arm")
        self.max_len = max(1, *(max_speculation(a) for a in arms))
        self.selector = make_selector(
            selector, len(arms), self.max_len, delta=delta, seed=seed, reward=reward
        )
        self.carry = carry
        opts = [f"delta={delta:g}"] if selector == "ucb" else [f"seed={seed}"]
        if reward != "tokens":
            opts.append(f"reward={reward}")
        if carry:
            opts.append("carry=1")
        names = [a.spec if d is None else f"{d}@{a.spec}" for a, d in zip(arms, self.drafters, strict=True)]
        self.spec = f"{selector}:{','.join(opts)},arms={'|'.join(names)}"
        self.arm: int | None = None
        self.history: list[int] = []  # arm of every round of the current prompt, for reports
        self._t0 = 0.0

    def to(self, device: torch.device | str) -> BanditPolicy:
        for a in self.arms:
            a.to(device)
        return self

    def attach_draft(self, model: torch.nn.Module) -> None:
        for a in self.arms:
            a.attach_draft(model)

    @property
    def max_cap(self) -> int:
        return max(a.max_cap for a in self.arms)

    def begin(self) -> None:
        """Start of a prompt: reset the statistics unless they are carried across prompts."""
        self.history = []
        if not self.carry:
            self.selector.reset()

    def start_round(self, position: int) -> int:
        if position == 0:
            self.begin()
        self.arm = self.selector.select()
        self.history.append(self.arm)
        current = self.arms[self.arm]
        self.needs_hidden = current.needs_hidden
        self.needs_state = current.needs_state
        self.free_token = current.free_token
        self._t0 = time.perf_counter()
        return current.start_round(position)

    def should_stop(self, step: DraftStep) -> bool:
        assert self.arm is not None, "should_stop before start_round"
        return self.arms[self.arm].should_stop(step)

    def end_round(self, drafted: int, accepted: int) -> None:
        assert self.arm is not None, "end_round before start_round"
        self.arms[self.arm].end_round(drafted, accepted)
        tokens = accepted + 1  # the target's bonus/correction token always comes with the round
        if self.selector.reward == "tokens":
            y = float(min(tokens, self.max_len + 1))
        else:
            y = tokens / max(time.perf_counter() - self._t0, 1e-9)
        self.selector.update(self.arm, y)
        self.arm = None

    def pull_counts(self) -> dict[str, int]:
        """Rounds per arm (its spec, with `drafter@` if it has one) since the last reset."""
        names = self.spec.split("arms=", 1)[1].split("|")
        return {name: int(n) for name, n in zip(names, self.selector.pulls, strict=True)}


_OPTION_KEYS = {"ucb": {"delta", "reward", "carry"}, "exp3": {"seed", "reward", "carry"}}


def parse_bandit(spec: str, *, head=None, allow_drafters: bool = False) -> BanditPolicy:
    """Build a BanditPolicy from `ucb:[delta=0.5,][reward=tokens,][carry=0,]arms=SPEC|SPEC|...`.

    `arms=` comes last and takes the rest of the string (arm specs contain commas); arms are split on
    '|' and parsed by `parse_policy` (so `head` serves specdecpp arms); `DRAFTER@POLICY` gives an arm its
    own drafter, allowed only when the caller builds the drafters (`decoder.bandit_decoder`). `exp3` takes
    `seed=` instead of `delta=`.
    """
    name, _, body = spec.strip().partition(":")
    name = name.strip().lower()
    if name not in _OPTION_KEYS:
        raise AccheadError(f"cannot parse bandit {spec!r}: expected 'ucb:' or 'exp3:'")
    head_part, sep, arm_part = body.partition("arms=")
    if not sep or not arm_part.strip():
        raise AccheadError(
            f"bandit {spec!r} needs arms=SPEC|SPEC|... (last), e.g. ucb:arms=specdec:k=2|specdec:k=4"
        )
    opts: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in head_part.split(","))):
        key, eq, value = item.partition("=")
        if not eq or key.strip() not in _OPTION_KEYS[name]:
            allowed = ", ".join(sorted(_OPTION_KEYS[name]))
            raise AccheadError(f"cannot parse bandit {spec!r}: {item!r} (options: {allowed}, then arms=)")
        opts[key.strip()] = value.strip()
    arms, drafters = [], []
    for item in arm_part.split("|"):
        drafter, at, policy = item.strip().rpartition("@")
        arms.append(parse_policy(policy.strip(), head=head))
        drafters.append(drafter.strip() if at else None)
        if at and not allow_drafters:
            raise AccheadError(f"bandit arm {item.strip()!r} names a drafter: build it with bandit_decoder")
    try:
        delta = float(opts.get("delta", 0.5))
        seed = int(opts.get("seed", 0))
    except ValueError:
        raise AccheadError(f"cannot parse bandit {spec!r}: delta must be a number, seed an integer") from None
    carry = opts.get("carry", "0").lower() in ("1", "true", "yes")
    reward = opts.get("reward", "tokens")
    return BanditPolicy(
        arms, name, drafters=drafters, delta=delta, seed=seed, reward=reward, carry=carry  # type: ignore[arg-type]
    )


class SwitchDrafter(Drafter):
    """A `Drafter` that hands each round to the drafter of the bandit's current arm.

    All drafters see every `begin`/`rollback`, so an idle one only lags behind the sequence; neural
    drafters catch up lazily from their cached prefix the next time they are chosen.
    """

    def __init__(self, drafters: Sequence[Drafter], arm_drafter: Sequence[int], policy: BanditPolicy) -> None:
        self.drafters = list(drafters)
        self.arm_drafter = list(arm_drafter)
        self.policy = policy
        self.device = self.drafters[0].device

    @property
    def draft_calls(self) -> int:
        return sum(d.draft_calls for d in self.drafters)

    def begin(self, input_ids: torch.Tensor, sampling: SamplingConfig, seed: int) -> None:
        for d in self.drafters:
            d.begin(input_ids, sampling, seed)

    def propose(
        self,
        context: torch.Tensor,
        index: int,
        want_hidden: bool,
        want_state: bool = False,
        judge: StopPolicy | None = None,
    ) -> DraftStep:
        """As `Drafter.propose` by the current arm's drafter; the bandit's policy judges the step itself."""
        assert self.policy.arm is not None, "propose outside a round"
        drafter = self.drafters[self.arm_drafter[self.policy.arm]]
        return drafter.propose(context, index, want_hidden, want_state)

    def rollback(self, length: int) -> None:
        for d in self.drafters:
            d.rollback(length)


# `parse_policy` reads ucb:/exp3: specs with this parser; `policies` cannot import this module, which
# imports it.
COMPOSITE_PARSERS.update(dict.fromkeys(_OPTION_KEYS, parse_bandit))
