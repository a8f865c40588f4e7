"""BanditSpec as a decoding policy (DESIGN §7): a selector picks each round's configuration.

Spec strings (the CLIs' `--policy`; parsed by `acchead.inference.policy_spec.BanditSpec`):

    ucb:arms=specdec:k=2|specdec:k=4|specdecpp:h=0.8,max=20      UCBSpec over stop policies
    exp3:seed=0,arms=specdec:k=2|specdec:k=6                      EXP3Spec (its own seeded generator)
    ucb:reward=rate,arms=...                                      reward = tokens per wall second
    ucb:carry=1,arms=...                                          keep statistics across prompts
    ucb:arms=specdec:k=3|mag@specdec:k=8|cascade:k=4.2/10@specdec:k=6
                                                                  arms with their own drafters (build
                                                                  with `bandit_decoder`)

`arms=` comes last (arm specs contain commas). Each round, the chosen arm's policy (and drafter) runs the
round; the reward y = accepted + 1 goes back to the selector. Choices depend only on finished rounds, so
the output is exactly the target's (BanditSpec Prop. 3.1) — tests/test_bandit.py checks greedy equality.
The selector's statistics, the arm of the round and the arms' own states live in the decode's
`BanditRun`; the policy itself never changes while decoding.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from acchead.errors import AccheadError
from acchead.inference.bandit import ArmSelector, RewardKind, make_selector
from acchead.inference.bandit_spec import ArmSpec, BanditSpec, EXP3BanditSpec, UCBBanditSpec
from acchead.inference.drafter_spec import DrafterSpec, as_drafter_spec
from acchead.inference.drafters import Drafter, DraftStep
from acchead.inference.policies import PolicyRun, StopPolicy
from acchead.sampling import SamplingConfig

if TYPE_CHECKING:
    pass


class BanditPolicy(StopPolicy):
    """A stop policy whose configuration is chosen per round by a BanditSpec selector.

    Each arm is a full stop policy (`specdec:k=4`, `specdecpp:h=0.8`, ...). A round asks the run's selector
    for an arm and delegates the round to the arm's own run; `end_round` feeds back y = accepted + 1 (or the
    round's tokens per wall second). The decoder reads `needs_hidden`/`free_token` from the run after
    `start_round`, so arms with different needs mix freely.

    An arm may also name its own drafter (`mag@specdec:k=8`, `cascade:k=4.2/10@specdec:k=6`); such a
    bandit needs `acchead.inference.bandit_decoder`, which gives the decoder a `SwitchDrafter` over
    the arms' drafters and passes its `select` as `on_select`.

    Args:
        arms: the candidate policies (no oracle: it needs hindsight).
        selector: "ucb" or "exp3".
        drafters: per arm, a drafter (`acchead.inference.drafter_spec`: typed or its string) or None for
            the draft model.
        delta: UCBSpec's confidence parameter.
        seed: EXP3Spec's own generator seed (independent of token sampling).
        reward: "tokens" or "rate".
        carry: keep the statistics across `generate` calls (prompts); the paper resets per prompt.
        on_select: called with the arm index at the start of every round (a `SwitchDrafter`'s `select`).
    """

    def __init__(
        self,
        arms: list[StopPolicy],
        selector: str = "ucb",
        *,
        drafters: list[DrafterSpec | str | None] | None = None,
        delta: float = 0.5,
        seed: int = 0,
        reward: RewardKind = "tokens",
        carry: bool = False,
        on_select: Callable[[int], None] | None = None,
    ) -> None:
        if not arms:
            raise AccheadError("a bandit policy needs at least one arm")
        if any(a.greedy_only or a.needs_reference for a in arms):
            raise AccheadError("the oracle cannot be a bandit arm (it needs hindsight)")
        drafters = list(drafters) if drafters is not None else [None] * len(arms)
        if len(drafters) != len(arms):
            raise AccheadError("one drafter entry per bandit arm")
        drafters = [None if d is None else as_drafter_spec(d) for d in drafters]
        arm_specs = tuple(ArmSpec(a.config, d) for a, d in zip(arms, drafters, strict=True))
        carried = True if carry else None
        rate = reward if reward != "tokens" else None
        if selector == "ucb":
            config: BanditSpec = UCBBanditSpec(arms=arm_specs, delta=delta, reward=rate, carry=carried)
        elif selector == "exp3":
            config = EXP3BanditSpec(arms=arm_specs, seed=seed, reward=rate, carry=carried)
        else:
            raise AccheadError(f"unknown bandit {selector!r} (expected 'ucb' or 'exp3')")
        super().__init__(config)
        self.arms = arms
        self.drafters = drafters
        self.kind, self.delta, self.seed, self.reward, self.carry = selector, delta, seed, reward, carry
        self.max_len = max(1, *(a.max_cap for a in arms))  # L: the longest speculation of any arm
        make_selector(selector, len(arms), self.max_len, delta=delta, seed=seed, reward=reward)  # checks
        self.on_select = on_select

    @classmethod
    def from_spec(
        cls, spec: BanditSpec, arms: list[StopPolicy], *, on_select: Callable[[int], None] | None = None
    ) -> BanditPolicy:
        """The bandit `spec` describes over its arms' policies, built by the caller in `spec.arms` order
        (`acchead.inference.policy_build.build_bandit`)."""
        delta = spec.delta if isinstance(spec, UCBBanditSpec) and spec.delta is not None else 0.5
        seed = spec.seed if isinstance(spec, EXP3BanditSpec) and spec.seed is not None else 0
        return cls(arms, spec.name, drafters=[a.drafter for a in spec.arms], delta=delta, seed=seed,
                   reward=spec.reward or "tokens", carry=bool(spec.carry), on_select=on_select)  # fmt: skip

    def new_selector(self) -> ArmSelector:
        """A selector with no history."""
        return make_selector(self.kind, len(self.arms), self.max_len, delta=self.delta, seed=self.seed,
                             reward=self.reward)  # fmt: skip

    def start_decode(
        self, previous: PolicyRun | None = None, reference: list[list[bool]] | None = None
    ) -> BanditRun:
        if self.carry and isinstance(previous, BanditRun) and previous.policy is self:
            return BanditRun(self, previous.selector, previous.arm_runs)
        return BanditRun(self, self.new_selector(), [a.start_decode() for a in self.arms])

    def to(self, device: torch.device | str) -> BanditPolicy:
        for a in self.arms:
            a.to(device)
        super().to(device)
        return self

    def attach_draft(self, model: torch.nn.Module) -> None:
        for a in self.arms:
            a.attach_draft(model)

    def price_widths(self, fed_ms: dict[int, float]) -> None:
        for a in self.arms:
            a.price_widths(fed_ms)

    @property
    def max_cap(self) -> int:
        return max(a.max_cap for a in self.arms)

    def start_round(self, run: PolicyRun, position: int) -> int:
        assert isinstance(run, BanditRun), "a bandit round needs the bandit's run"
        run.arm = run.selector.select()
        run.history.append(run.arm)
        if self.on_select is not None:
            self.on_select(run.arm)
        run.t0 = time.perf_counter()
        return run.arm_runs[run.arm].start_round(position)

    def should_stop(self, run: PolicyRun, step: DraftStep) -> bool:
        assert isinstance(run, BanditRun) and run.arm is not None, "should_stop before start_round"
        arm_run = run.arm_runs[run.arm]
        calls = arm_run.head_calls
        stop = arm_run.should_stop(step)
        run.head_calls += arm_run.head_calls - calls  # the decode's count, whichever arm judged
        return stop

    def end_round(self, run: PolicyRun, drafted: int, accepted: int) -> None:
        assert isinstance(run, BanditRun) and run.arm is not None, "end_round before start_round"
        run.arm_runs[run.arm].end_round(drafted, accepted)
        tokens = accepted + 1  # the target's bonus/correction token always comes with the round
        if run.selector.reward == "tokens":
            y = float(min(tokens, self.max_len + 1))
        else:
            y = tokens / max(time.perf_counter() - run.t0, 1e-9)
        run.selector.update(run.arm, y)
        run.arm = None


class BanditRun(PolicyRun):
    """One decode of a bandit: its selector (fresh, or the previous decode's with `carry`), each arm's own
    run, the arm of the current round and the arm of every round so far (`history`, for reports)."""

    def __init__(self, policy: BanditPolicy, selector: ArmSelector, arm_runs: list[PolicyRun]) -> None:
        super().__init__(policy)
        self.bandit = policy
        self.selector = selector
        self.arm_runs = arm_runs
        self.arm: int | None = None
        self.history: list[int] = []
        self.t0 = 0.0

    def _current(self) -> PolicyRun | None:
        return None if self.arm is None else self.arm_runs[self.arm]

    @property
    def needs_hidden(self) -> bool:
        run = self._current()
        return run is not None and run.needs_hidden

    @property
    def needs_state(self) -> bool:
        run = self._current()
        return run is not None and run.needs_state

    @property
    def free_token(self) -> bool:
        run = self._current()
        return run is not None and run.free_token

    def pull_counts(self) -> dict[str, int]:
        """Rounds per arm (its spec, with `drafter@` if it has one) since the statistics were last reset."""
        names = [a.to_spec() for a in self.bandit.config.arms]  # type: ignore[attr-defined]
        return {name: int(n) for name, n in zip(names, self.selector.pulls, strict=True)}


class SwitchDrafter(Drafter):
    """A `Drafter` that hands each round to the drafter of the bandit's current arm.

    All drafters see every `begin`/`rollback`, so an idle one only lags behind the sequence; neural
    drafters catch up lazily from their cached prefix the next time they are chosen.
    """

    def __init__(self, drafters: Sequence[Drafter], arm_drafter: Sequence[int]) -> None:
        self.drafters = list(drafters)
        self.arm_drafter = list(arm_drafter)
        self.arm: int | None = None  # the arm of the current round (`select`)
        self.device = self.drafters[0].device

    def select(self, arm: int) -> None:
        """The bandit's arm for the round that starts (`BanditPolicy(on_select=...)`)."""
        self.arm = arm

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
        judge: PolicyRun | None = None,
    ) -> DraftStep:
        """As `Drafter.propose` by the current arm's drafter; the bandit's policy judges the step itself."""
        assert self.arm is not None, "propose outside a round"
        drafter = self.drafters[self.arm_drafter[self.arm]]
        return drafter.propose(context, index, want_hidden, want_state, judge=judge)

    def rollback(self, length: int) -> None:
        for d in self.drafters:
            d.rollback(length)

