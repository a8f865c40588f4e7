"""A stop policy's spec as a frozen, typed value: one dataclass per policy, and its string form.

The string form is what every CLI's `--policy` and the bench's specs take:

    autoregressive                              no drafting (the baseline)
    specdec:k=4                                 fixed K candidates per round
    specdecpp[:h=0.8,max=20,free=1,priced=1]    SpecDec++ (no h: the head's recorded threshold)
    confidence:tau=0.4[,max=20]                 stop after a candidate with q(x) < tau
    entropy:tau=1.0[,max=20]                    stop after a candidate with H(q) > tau nats
    adaedl:lam=0.5[,gamma=0.2,adapt=1,max=20]   AdaEDL, fixed or online lambda
    oracle[:max=64]                             greedy hindsight bound
    ucb:... | exp3:...                          bandits over arms (`acchead.inference.bandit_spec`)

`acchead.inference.spec.parse_policy_spec(text)` parses one through the registry of every policy,
`POLICY_SPECS` (AccheadError, one line, for anything malformed), and `to_spec()` writes it back: a
parameter left out is None in the value ("the default") and is left out again, so
`parse_policy_spec(s.to_spec()) == s` for every spec. A built policy's own `spec` is its resolved spec,
every default filled in (`specdecpp` gets the head's h): the canonical string results and reports name.

A class says whether its policy reads an acceptance head (`needs_head`) and how many candidates a round
can draft (`max_cap`); `acchead.inference.policy_build` builds the policy it describes. Pure data: no
torch and no decoding module is imported here, so the CLIs parse and check a spec before loading anything.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, get_args, get_type_hints

from acchead.errors import AccheadError

# Cap for policies whose spec gives none: the paper's SpecDec++ cap and Hugging Face's default
# `num_assistant_tokens`.
DEFAULT_MAX_DRAFT = 20
# The most candidates any round may be given (k=, max=): state is sized by it, and no context or head makes
# a longer round pay, so a larger value is a typo refused in one line, not a failed allocation.
MAX_ROUND_CANDIDATES = 1024
ORACLE_MAX_DRAFT = 64
# AdaEDL's entropy factor γ: the value of the paper's §3.1 (Agrawal et al. 2024).
ADAEDL_GAMMA = 0.2


def format_number(value: float | int | bool) -> str:
    """A parameter as the spec writes it: 1/0 for flags, `:g` for numbers when that is exact, else repr."""
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    short = f"{value:g}"
    return short if float(short) == value else repr(value)


def parse_value(text: str, key: str, value: str, kind: type) -> int | float | bool | str:
    if kind is bool:
        if value.lower() in ("1", "true", "yes"):
            return True
        if value.lower() in ("0", "false", "no"):
            return False
        raise AccheadError(f"cannot parse policy {text!r}: {key}={value!r} is not 0/1")
    try:
        return kind(value)
    except ValueError:
        raise AccheadError(f"cannot parse policy {text!r}: {key}={value!r} is not {kind.__name__}") from None


def key_values(text: str, body: str) -> dict[str, str]:
    """`k=v,k=v` as a dict (one-line errors for a missing '=' or a key given twice)."""
    params: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in body.split(","))):
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise AccheadError(f"cannot parse policy {text!r}: expected key=value, got {item!r}")
        if key in params:
            raise AccheadError(f"cannot parse policy {text!r}: {key!r} given twice")
        params[key] = value
    return params


def _value_type(hint: object) -> type:
    """The scalar type of a field's annotation ("int | None" -> int)."""
    args = get_args(hint)
    if args:
        return next(a for a in args if a is not type(None))
    return hint  # type: ignore[return-value]


@dataclass(frozen=True, kw_only=True)
class PolicySpec:
    """Base of the typed specs: a policy's name and parameters; None for a parameter means its default.

    A subclass declares its parameters as fields (int, float or bool, None when optional), its `name`, an
    `example` for error messages, and validates its values in `_check`.
    `acchead.inference.spec.parse_policy_spec` parses any registered one; `to_spec` writes it back.
    """

    name: ClassVar[str] = ""
    example: ClassVar[str] = ""
    needs_head: ClassVar[bool] = False  # the policy reads an acceptance head (`specdecpp`)

    def __post_init__(self) -> None:
        self._check()

    def _check(self) -> None:
        """Raise AccheadError (one line) for a value outside the policy's range."""

    @classmethod
    def parse_body(cls, text: str, body: str, parse: Callable[[str], PolicySpec]) -> PolicySpec:
        """This policy's spec from `body`, the text after "name:" of `text` (`parse` reads a nested spec:
        a bandit's arms)."""
        params = key_values(text, body)
        hints = get_type_hints(cls)
        fields = [f for f in dataclasses.fields(cls)]
        allowed = {f.name for f in fields}
        unknown = set(params) - allowed
        if unknown:
            hint = ", ".join(sorted(allowed)) or "no parameters"
            raise AccheadError(f"policy {cls.name!r} takes {hint}; got {', '.join(sorted(unknown))}")
        required = {f.name for f in fields if f.default is dataclasses.MISSING}
        missing = required - set(params)
        if missing:
            raise AccheadError(f"policy {text!r} needs {', '.join(sorted(missing))} (e.g. {cls.example})")
        values = {k: parse_value(text, k, v, _value_type(hints[k])) for k, v in params.items()}
        return cls(**values)

    def to_spec(self) -> str:
        """The string form: the parameters that are set, in field order (`from_spec` reads it back)."""
        given = [(f.name, getattr(self, f.name)) for f in dataclasses.fields(self)]
        body = ",".join(f"{k}={format_number(v)}" for k, v in given if v is not None)
        return f"{self.name}:{body}" if body else self.name

    def __str__(self) -> str:
        return self.to_spec()

    @property
    def max_cap(self) -> int:
        """The most candidates a round of this policy can draft."""
        return DEFAULT_MAX_DRAFT



def _check_max(spec: PolicySpec, value: int | None, key: str = "max") -> None:
    if value is not None and not 1 <= value <= MAX_ROUND_CANDIDATES:
        raise AccheadError(f"{spec.name} needs 1 <= {key} <= {MAX_ROUND_CANDIDATES}, got {key}={value}")


@dataclass(frozen=True, kw_only=True)
class AutoregressiveSpec(PolicySpec):
    """No drafting: one target forward per token."""

    name: ClassVar[str] = "autoregressive"
    example: ClassVar[str] = "autoregressive"

    @property
    def max_cap(self) -> int:
        return 0



@dataclass(frozen=True, kw_only=True)
class SpecDecSpec(PolicySpec):
    """SpecDec (Leviathan/Chen): k candidates every round."""

    name: ClassVar[str] = "specdec"
    example: ClassVar[str] = "specdec:k=4"
    k: int

    def _check(self) -> None:
        _check_max(self, self.k, "k")

    @property
    def max_cap(self) -> int:
        return self.k



@dataclass(frozen=True, kw_only=True)
class SpecDecPPSpec(PolicySpec):
    """SpecDec++: stop once the head's P(some candidate rejected) > h; no h: the head's `default_h`.

    `free` (default 1) appends the already-computed next candidate after an early stop (candidate heads
    only: a lookahead head judges a candidate before it is fed, so its built spec leaves `free` out).
    `priced` (default 0) raises the threshold where a candidate moves the round into a dearer verification
    width, priced by the fast path's measured units (`acchead.inference.specdecpp_policy`)."""

    name: ClassVar[str] = "specdecpp"
    example: ClassVar[str] = "specdecpp:h=0.8,max=20"
    needs_head: ClassVar[bool] = True
    h: float | None = None
    max: int | None = None
    free: bool | None = None
    priced: bool | None = None

    def _check(self) -> None:
        if self.h is not None and not 0.0 < self.h < 1.0:
            raise AccheadError(f"specdecpp needs 0 < h < 1, got h={self.h}")
        _check_max(self, self.max)

    @property
    def max_cap(self) -> int:
        return DEFAULT_MAX_DRAFT if self.max is None else self.max



@dataclass(frozen=True, kw_only=True)
class ConfidenceSpec(PolicySpec):
    """Stop after a candidate the draft found unlikely: q(x) < tau (Hugging Face's confidence rule)."""

    name: ClassVar[str] = "confidence"
    example: ClassVar[str] = "confidence:tau=0.4"
    tau: float
    max: int | None = None

    def _check(self) -> None:
        if not 0.0 <= self.tau <= 1.0:
            raise AccheadError(f"confidence needs 0 <= tau <= 1, got tau={self.tau}")
        _check_max(self, self.max)

    @property
    def max_cap(self) -> int:
        return DEFAULT_MAX_DRAFT if self.max is None else self.max



@dataclass(frozen=True, kw_only=True)
class EntropySpec(PolicySpec):
    """Stop after a candidate whose draft distribution has entropy H(q) > tau nats."""

    name: ClassVar[str] = "entropy"
    example: ClassVar[str] = "entropy:tau=1.0"
    tau: float
    max: int | None = None

    def _check(self) -> None:
        if not (self.tau >= 0.0 and math.isfinite(self.tau)):
            raise AccheadError(f"entropy needs a finite tau >= 0 (nats), got tau={self.tau}")
        _check_max(self, self.max)

    @property
    def max_cap(self) -> int:
        return DEFAULT_MAX_DRAFT if self.max is None else self.max



@dataclass(frozen=True, kw_only=True)
class AdaEDLSpec(PolicySpec):
    """AdaEDL: stop once 1 - sqrt(gamma·H(q)) < lam; adapt (default 1) moves lam online."""

    name: ClassVar[str] = "adaedl"
    example: ClassVar[str] = "adaedl:lam=0.5"
    gamma: float | None = None
    lam: float
    adapt: bool | None = None
    max: int | None = None

    def _check(self) -> None:
        if not 0.0 <= self.lam <= 1.0:
            raise AccheadError(f"adaedl needs 0 <= lam <= 1, got lam={self.lam}")
        if self.gamma is not None and not (self.gamma > 0.0 and math.isfinite(self.gamma)):
            raise AccheadError(f"adaedl needs a finite gamma > 0, got gamma={self.gamma}")
        _check_max(self, self.max)

    @property
    def max_cap(self) -> int:
        return DEFAULT_MAX_DRAFT if self.max is None else self.max



@dataclass(frozen=True, kw_only=True)
class OracleSpec(PolicySpec):
    """The greedy hindsight bound: each round drafts exactly the run the target will accept."""

    name: ClassVar[str] = "oracle"
    example: ClassVar[str] = "oracle"
    max: int | None = None

    def _check(self) -> None:
        _check_max(self, self.max)

    @property
    def max_cap(self) -> int:
        return ORACLE_MAX_DRAFT if self.max is None else self.max

