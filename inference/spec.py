"""The one typed decoding configuration: drafter, stop policy (with its parameters), verifier, sampling, path,
head; and the registry of every policy a spec can name.

    spec = DecodingSpec.from_spec("specdecpp:h=0.7", head="head.safetensors", verifier="block")
    spec = DecodingSpec.from_spec("mag+specdec:k=10")          # DRAFTER+POLICY: a model-free drafter
    decoder = build_decoder(spec, target, draft)               # acchead.inference.decoder_factory

The string form is `[DRAFTER+]POLICY`: POLICY as `acchead.inference.policy_spec` writes it, DRAFTER as
`acchead.inference.drafter_spec` does (`mag`, `cascade:k=4.2/10`); the other fields are typed
values beside it. `from_spec(s.to_spec(), ...) == s`. `acchead-decode` and the bench's settings decode
from one. Pure data: this module imports no torch and no decoding module.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from acchead.errors import AccheadError
from acchead.inference.bandit_spec import BanditSpec, EXP3BanditSpec, UCBBanditSpec
from acchead.inference.drafter_spec import CopySpec, DrafterSpec, parse_drafter_spec
from acchead.inference.policy_spec import (
    AdaEDLSpec,
    AutoregressiveSpec,
    ConfidenceSpec,
    EntropySpec,
    OracleSpec,
    PolicySpec,
    SpecDecPPSpec,
    SpecDecSpec,
)
from acchead.sampling import SamplingConfig

# The one registry: every policy a spec string can name, by name.
_REGISTERED: tuple[type[PolicySpec], ...] = (
    AutoregressiveSpec, SpecDecSpec, SpecDecPPSpec, ConfidenceSpec, EntropySpec, AdaEDLSpec, OracleSpec,
    UCBBanditSpec, EXP3BanditSpec,
)  # fmt: skip
POLICY_SPECS: dict[str, type[PolicySpec]] = {cls.name: cls for cls in _REGISTERED}
VERIFIERS = ("token", "block")
PATHS = ("eager", "fast")
DecodePath = Literal["eager", "fast"]


def parse_policy_spec(text: str) -> PolicySpec:
    """The typed spec of a policy string (`NAME[:key=value,...]`); AccheadError (one line) if malformed."""
    name, _, body = text.strip().partition(":")
    name = name.strip().lower()
    kind = POLICY_SPECS.get(name)
    if kind is None:
        names = ", ".join(k.example for k in POLICY_SPECS.values())
        drafter = name in ("copy", "mag", "cascade")
        drafters = f" (a drafter: give it a policy, e.g. {name}+specdec:k=2)" if drafter else ""
        raise AccheadError(f"cannot parse policy {text!r}: unknown name {name!r}{drafters}; one of {names}")
    return kind.parse_body(text, body, parse_policy_spec)


def as_policy_spec(spec: str | PolicySpec) -> PolicySpec:
    """`spec` as a typed value (parsed when a string)."""
    return parse_policy_spec(spec) if isinstance(spec, str) else spec


def needs_head(spec: str | PolicySpec) -> bool:
    """True if the policy (or some bandit arm of it) reads an acceptance head; parses a string spec."""
    return as_policy_spec(spec).needs_head


@dataclass(frozen=True)
class DecodingSpec:
    """Everything that says how to decode, as one frozen value.

    Attributes:
        policy: the stop policy and its parameters.
        drafter: a model-free or cascaded drafter (`MaGSpec`, `CascadeSpec`), copy rounds beside the draft
            model (`CopySpec`), or None for the draft model alone.
        verifier: "token" (Leviathan/Chen) or "block" (Sun et al. 2024).
        sampling: S, or None where the caller supplies it per call (the bench, transformers' generate).
        path: "eager", "fast" (static caches, compiled forwards), or None: the device's default.
        head: the acceptance head file a `specdecpp` policy reads (None for other policies).
    """

    policy: PolicySpec
    drafter: DrafterSpec | None = None
    verifier: str = "token"
    sampling: SamplingConfig | None = None
    path: DecodePath | None = None
    head: str | None = None

    def __post_init__(self) -> None:
        if self.verifier not in VERIFIERS:
            raise AccheadError(f"verifier must be one of {', '.join(VERIFIERS)}, got {self.verifier!r}")
        if self.path is not None and self.path not in PATHS:
            raise AccheadError(f"path must be one of {', '.join(PATHS)}, got {self.path!r}")
        if self.drafter is not None and isinstance(self.policy, BanditSpec) and self.policy.has_drafters:
            raise AccheadError("a bandit whose arms name drafters takes no DRAFTER+ of its own")

    @classmethod
    def from_spec(cls, text: str, **fields: Any) -> DecodingSpec:
        """Parse `[DRAFTER+]POLICY`; `fields` sets the other attributes (verifier, sampling, path, head)."""
        drafter, plus, policy = text.strip().partition("+")
        if not plus:
            drafter, policy = "", text
        if plus and not drafter.strip():
            raise AccheadError(f"cannot parse {text!r}: DRAFTER+POLICY needs a drafter before '+'")
        typed = parse_drafter_spec(drafter) if drafter.strip() else None
        return cls(parse_policy_spec(policy), typed, **fields)

    def to_spec(self) -> str:
        """`[DRAFTER+]POLICY`: the policy's string, after its drafter's."""
        policy = self.policy.to_spec()
        return policy if self.drafter is None else f"{self.drafter.to_spec()}+{policy}"

    def __str__(self) -> str:
        return self.to_spec()

    @property
    def needs_head(self) -> bool:
        return self.policy.needs_head

    @property
    def name(self) -> str:
        """What the spec decodes with, in a word: its drafter's name ("mag", "cascade"), else its policy's."""
        return self.policy.name if self.drafter is None else self.drafter.name

    @property
    def uses_drafters(self) -> bool:
        """It names a drafter besides the draft model (`DRAFTER+`, or a bandit arm's `DRAFTER@`)."""
        return self.drafter is not None or (isinstance(self.policy, BanditSpec) and self.policy.has_drafters)

    @property
    def needs_bigram(self) -> bool:
        """Its drafters read MaG's bigram table (`mag`, `cascade`, in `DRAFTER+` or a bandit arm)."""
        if isinstance(self.policy, BanditSpec) and self.policy.has_drafters:
            return True
        return self.drafter is not None and self.drafter.needs_bigram

    @property
    def fast(self) -> bool | None:
        """The `fast` argument of `SpeculativeDecoder`: None for the device's default."""
        return None if self.path is None else self.path == "fast"


def as_decoding_spec(spec: DecodingSpec | str) -> DecodingSpec:
    """`spec` as a typed value (parsed when a string)."""
    return DecodingSpec.from_spec(spec) if isinstance(spec, str) else spec


def split_copy_rounds(spec: DecodingSpec | str) -> tuple[DecodingSpec, CopySpec | None]:
    """(the spec without its copy rounds, the copy rounds or None): a single-prompt decoder wraps its
    drafter for them (`acchead.inference.copy_drafter`) and takes the rest as any spec."""
    spec = as_decoding_spec(spec)
    if isinstance(spec.drafter, CopySpec):
        return replace(spec, drafter=None), spec.drafter
    return spec, None


def take_copy_rounds(
    spec: DecodingSpec | str | None, copy: CopySpec | None
) -> tuple[DecodingSpec | None, CopySpec | None]:
    """(spec without its copy rounds, the copy rounds from `spec` or `copy`) for a decoder that takes both
    arguments; one line if both name them."""
    if spec is None:
        return None, copy
    spec, in_spec = split_copy_rounds(spec)
    if in_spec is not None and copy is not None:
        raise AccheadError("pass copy rounds in spec= or in copy=, not both")
    return spec, copy if copy is not None else in_spec


def spec_arguments(
    spec: DecodingSpec | str | None, policy: Any, head: Any, verifier: str | None, fast: bool | None
) -> tuple[Any, Any, str, bool | None]:
    """(policy, head, verifier, fast) for a decoder that takes either a `spec` or those four (`policy` None:
    "specdec:k=4"; `verifier` None: "token"). Refuses both at once, and a spec that names a model-free
    drafter, which `acchead.inference.decoder_factory.build_decoder` builds."""
    if spec is None:
        verifier = verifier or "token"
        if verifier not in VERIFIERS:
            raise AccheadError(f"verifier must be one of {', '.join(VERIFIERS)}, got {verifier!r}")
        return ("specdec:k=4" if policy is None else policy), head, verifier, fast
    if policy is not None or head is not None or verifier is not None or fast is not None:
        raise AccheadError("pass either spec= or policy= / head= / verifier= / fast=, not both")
    spec = as_decoding_spec(spec)
    if isinstance(spec.drafter, CopySpec):
        raise AccheadError(f"spec {spec.to_spec()!r}: copy rounds wrap a decoder's drafter: pass them as "
                           "copy= (split_copy_rounds)")  # fmt: skip
    if spec.uses_drafters:
        raise AccheadError(f"spec {spec.to_spec()!r} names a drafter: decode it with acchead-decode or "
                           "build_decoder(spec, target, draft)")  # fmt: skip
    return spec.policy, spec.head if spec.needs_head else None, spec.verifier, spec.fast
