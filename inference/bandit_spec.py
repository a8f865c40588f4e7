"""A BanditSpec policy's spec as a typed value: the selector, its options and its arms.

    ucb:[delta=0.5,][reward=tokens,][carry=0,]arms=SPEC|SPEC|...      UCBSpec over stop policies
    exp3:[seed=0,][reward=tokens,][carry=0,]arms=[DRAFTER@]SPEC|...   EXP3Spec; an arm may name a drafter

`arms=` comes last (arm specs contain commas); arms are split on '|'. The built policy is
`acchead.inference.bandit_policy.BanditPolicy`; both selectors are in the registry of
`acchead.inference.spec`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Literal

from acchead.errors import AccheadError
from acchead.inference.drafter_spec import DrafterSpec, parse_drafter_spec
from acchead.inference.policy_spec import OracleSpec, PolicySpec, format_number, key_values, parse_value


@dataclass(frozen=True)
class ArmSpec:
    """One bandit arm: a policy, and the drafter that drafts its rounds (None: the draft model; else an
    `acchead.inference.drafter_spec` value such as `mag` or `cascade:k=4.2/10`)."""

    policy: PolicySpec
    drafter: DrafterSpec | None = None

    def to_spec(self) -> str:
        policy = self.policy.to_spec()
        return policy if self.drafter is None else f"{self.drafter.to_spec()}@{policy}"


@dataclass(frozen=True, kw_only=True)
class BanditSpec(PolicySpec):
    """BanditSpec: a selector picks each round's arm (`acchead.inference.bandit_policy`). `arms=` comes
    last in the string (arm specs contain commas); `carry=1` keeps the statistics across prompts."""

    arms: tuple[ArmSpec, ...]
    reward: Literal["tokens", "rate"] | None = None
    carry: bool | None = None
    options: ClassVar[tuple[str, ...]] = ()  # the selector's own numeric options, in spec order

    def _check(self) -> None:
        if not self.arms:
            raise AccheadError(f"a {self.name} bandit needs at least one arm")
        if any(isinstance(a.policy, OracleSpec | BanditSpec) for a in self.arms):
            raise AccheadError("the oracle (it needs hindsight) or a bandit cannot be a bandit arm")
        if self.reward not in (None, "tokens", "rate"):
            raise AccheadError(f"bandit reward must be 'tokens' or 'rate', got {self.reward!r}")

    @property
    def needs_head(self) -> bool:  # type: ignore[override]
        return any(a.policy.needs_head for a in self.arms)

    @property
    def max_cap(self) -> int:
        return max(a.policy.max_cap for a in self.arms)

    @property
    def has_drafters(self) -> bool:
        """Some arm names its own drafter (build with `acchead.inference.bandit_decoder`)."""
        return any(a.drafter is not None for a in self.arms)

    @classmethod
    def parse_body(cls, text: str, body: str, parse: Callable[[str], PolicySpec]) -> PolicySpec:
        opt_part, sep, arm_part = body.partition("arms=")
        if not sep or not arm_part.strip():
            raise AccheadError(
                f"bandit {text!r} needs arms=SPEC|SPEC|... (last), e.g. ucb:arms=specdec:k=2|specdec:k=4"
            )
        allowed = (*cls.options, "reward", "carry")
        opts: dict[str, object] = {}
        for key, value in key_values(text, opt_part).items():
            if key not in allowed:
                raise AccheadError(f"cannot parse bandit {text!r}: {key!r} (options: {', '.join(allowed)}, "
                                   "then arms=)")  # fmt: skip
            kinds = {"delta": float, "seed": int, "carry": bool, "reward": str}
            opts[key] = parse_value(text, key, value, kinds[key])
        arms = []
        for item in arm_part.split("|"):
            drafter, at, policy = item.strip().rpartition("@")
            arms.append(ArmSpec(parse(policy), parse_drafter_spec(drafter) if at else None))
        return cls(arms=tuple(arms), **opts)  # type: ignore[arg-type]

    def to_spec(self) -> str:
        opts = [f"{k}={format_number(v)}" for k in self.options if (v := getattr(self, k)) is not None]
        if self.reward is not None:
            opts.append(f"reward={self.reward}")
        if self.carry is not None:
            opts.append(f"carry={int(self.carry)}")
        arms = "|".join(a.to_spec() for a in self.arms)
        return f"{self.name}:{''.join(o + ',' for o in opts)}arms={arms}"



@dataclass(frozen=True, kw_only=True)
class UCBBanditSpec(BanditSpec):
    """UCBSpec over the arms; `delta` (default 0.5) is its confidence parameter."""

    name: ClassVar[str] = "ucb"
    example: ClassVar[str] = "ucb:arms=specdec:k=2|specdec:k=4"
    options: ClassVar[tuple[str, ...]] = ("delta",)
    delta: float | None = None

    def _check(self) -> None:
        super()._check()
        if self.delta is not None and not 0 < self.delta < 1:
            raise AccheadError(f"ucb delta must lie in (0, 1), got {self.delta}")


@dataclass(frozen=True, kw_only=True)
class EXP3BanditSpec(BanditSpec):
    """EXP3Spec over the arms; `seed` (default 0) seeds its own generator, apart from the token sampler."""

    name: ClassVar[str] = "exp3"
    example: ClassVar[str] = "exp3:seed=0,arms=specdec:k=2|specdec:k=6"
    options: ClassVar[tuple[str, ...]] = ("seed",)
    seed: int | None = None
