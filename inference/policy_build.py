"""Build the stop policy a typed spec describes (`acchead.inference.spec`): the one place that knows which
policy class realises each registered spec, and that a `specdecpp` policy reads an acceptance head.

    policy = parse_policy("specdecpp:h=0.8,max=20", head=head)     # a string, or its typed spec
    run = policy.start_decode()                                     # one decode's state (see `policies`)

The spec modules are pure data; this module imports every policy class, so the policies never import it
back (and no policy registers itself anywhere: `POLICY_SPECS` names them all).
"""

from __future__ import annotations

from pathlib import Path

from acchead.errors import AccheadError
from acchead.head import AcceptanceHead
from acchead.inference.adaedl import AdaEDL
from acchead.inference.bandit_policy import BanditPolicy
from acchead.inference.bandit_spec import BanditSpec
from acchead.inference.policies import (
    Autoregressive,
    Confidence,
    Entropy,
    FixedK,
    Oracle,
    StopPolicy,
)
from acchead.inference.policy_spec import (
    ADAEDL_GAMMA,
    AdaEDLSpec,
    AutoregressiveSpec,
    ConfidenceSpec,
    EntropySpec,
    OracleSpec,
    PolicySpec,
    SpecDecPPSpec,
    SpecDecSpec,
)
from acchead.inference.spec import as_policy_spec
from acchead.inference.specdecpp_policy import SpecDecPP

HeadArg = AcceptanceHead | str | Path | None


def load_policy_head(head: HeadArg) -> AcceptanceHead | None:
    """`head` as a module: a path is loaded with `acchead.load_head` (without a draft check —
    `SpeculativeDecoder` does that check when it gets the path itself)."""
    if head is None or isinstance(head, AcceptanceHead):
        return head
    from acchead.head_io import load_head

    return load_head(head)[0]


def parse_policy(spec: str | PolicySpec, *, head: HeadArg = None) -> StopPolicy:
    """Build a fresh StopPolicy from its spec (a string, `acchead.inference.policy_spec`'s grammar, or the
    typed value).

    Args:
        spec: e.g. "specdec:k=4", "specdecpp:h=0.8,max=20"; `specdecpp` without `h` takes the head's
            recorded threshold (`AcceptanceHead.default_h`).
        head: the acceptance head for `specdecpp` (and bandits with specdecpp arms): a module or a path.

    Raises:
        AccheadError: unknown name or key, malformed number, specdecpp without a head, h outside (0, 1),
            K < 1, a bandit arm that names a drafter (those need `acchead.inference.bandit_decoder`).
    """
    typed = as_policy_spec(spec)
    if isinstance(typed, BanditSpec):
        if typed.has_drafters:
            arm = next(a for a in typed.arms if a.drafter is not None)
            raise AccheadError(f"bandit arm {arm.to_spec()!r} names a drafter: build it with bandit_decoder")
        return build_bandit(typed, head)
    return _build(typed, load_policy_head(head) if typed.needs_head else None)


def build_bandit(spec: BanditSpec, head: HeadArg = None, on_select=None) -> BanditPolicy:
    """The bandit `spec` describes, its arms built here (drafter arms included: their drafters are the
    caller's); `on_select` as for `BanditPolicy`."""
    module = load_policy_head(head) if spec.needs_head else None  # loaded once for every arm
    arms = [_build(a.policy, module) for a in spec.arms]
    return BanditPolicy.from_spec(spec, arms, on_select=on_select)


def _build(spec: PolicySpec, head: AcceptanceHead | None) -> StopPolicy:
    """A policy of one of the registered simple kinds (bandit arms cannot nest)."""
    if isinstance(spec, AutoregressiveSpec):
        return Autoregressive()
    if isinstance(spec, SpecDecSpec):
        return FixedK(spec.k)
    if isinstance(spec, SpecDecPPSpec):
        if head is None:
            raise AccheadError(
                f"policy {spec.to_spec()!r} needs an acceptance head (give --head PATH or head=...)"
            )
        h = head.default_h if spec.h is None else spec.h
        return SpecDecPP(head, h, spec.max_cap, spec.free is not False, priced=spec.priced is True)
    if isinstance(spec, ConfidenceSpec):
        return Confidence(spec.tau, spec.max_cap)
    if isinstance(spec, EntropySpec):
        return Entropy(spec.tau, spec.max_cap)
    if isinstance(spec, AdaEDLSpec):
        gamma = ADAEDL_GAMMA if spec.gamma is None else spec.gamma
        return AdaEDL(spec.lam, gamma, spec.adapt is not False, spec.max_cap)
    if isinstance(spec, OracleSpec):
        return Oracle(spec.max_cap)
    raise AccheadError(f"policy {spec.to_spec()!r} cannot be built here")  # a bandit inside a bandit
