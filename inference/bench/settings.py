"""The grid of `acchead-bench`: its methods, the method families of result rows, and the settings (one
decoding configuration each) that the methods and grids of the command line expand to.

A setting decodes with a typed `acchead.inference.spec.DecodingSpec` (policy and parameters, drafter,
verifier, path, head), built here from the grids: nothing downstream parses a spec string. The methods are
one typed table (`METHODS`): whether a method's rows enter the cost fit is said there, once.

`--head` takes several heads (comma-separated; a YAML list): each expands the `specdecpp` h-grid into its
own method family, named after the head's kind (`HEAD_FAMILIES`), so one run compares a candidate and a
lookahead head side by side.
"""

from __future__ import annotations

import argparse
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from acchead.errors import AccheadError
from acchead.inference.drafter_spec import CopySpec
from acchead.inference.policy_spec import (
    AdaEDLSpec,
    AutoregressiveSpec,
    ConfidenceSpec,
    EntropySpec,
    OracleSpec,
    SpecDecPPSpec,
    SpecDecSpec,
)
from acchead.inference.spec import DecodingSpec
from acchead.sampling import SamplingConfig


@dataclass(frozen=True)
class Method:
    """One `--methods` entry.

    Attributes:
        name: the method, and the family of its rows (SpecDec++ rows take their head's family instead).
        fitted: its per-prompt wall times enter the cost fit, and it runs once per `--paths` path: the
            draft-model decoders that T = t_draft·N_draft + t_target·N_target describes. The oracle peeks at
            the target's greedy continuation and HF / extra drafters have other per-call costs, so they are
            measured but not fitted.
    """

    name: str
    fitted: bool


METHODS = (
    Method("autoregressive", True), Method("specdec", True), Method("specdecpp", True),
    Method("confidence", True), Method("entropy", True), Method("adaedl", True), Method("adaedl-adapt", True),
    Method("oracle", False), Method("hf-assisted", False), Method("hf-generate", False),
    Method("hf-custom", False), Method("extra", False),
)  # fmt: skip
FAMILIES = tuple(m.name for m in METHODS)
# The method family of a SpecDec++ head's h-grid, by head kind (`AcceptanceHead.kind`); two heads that would
# share a family get their name appended: "specdecpp-lookahead[greedy-r1]".
HEAD_FAMILIES = {"candidate": "specdecpp", "lookahead": "specdecpp-lookahead"}
# Families whose per-prompt wall times enter the cost fit (`Method.fitted`; both kinds of SpecDec++ head).
FIT_FAMILIES = tuple(
    family
    for m in METHODS
    if m.fitted
    for family in (HEAD_FAMILIES.values() if m.name == "specdecpp" else (m.name,))
)
# A fast-path row's family is its eager family with this suffix ("specdec@fast"), so every analysis of the
# eager rows is unchanged beside it (the paths themselves: `acchead.inference.spec.PATHS`).
FAST_SUFFIX = "@fast"


@dataclass(frozen=True)
class Setting:
    """One row of the bench: a method family with its parameters and the decoding configuration that
    realises it.

    `decoding` is None for transformers' own generate and assisted generation (`hf-generate`,
    `hf-assisted`); `hf-custom` decodes its twin's configuration through transformers' `generate`. `key`
    names the setting's partial-result file; SpecDec++ settings of several heads share specs, so their keys
    and labels also name the family.
    """

    family: str
    decoding: DecodingSpec | None
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def spec(self) -> str:
        """The decoding's `[DRAFTER+]POLICY` string ("" for transformers' own decoders)."""
        return "" if self.decoding is None else self.decoding.to_spec()

    @property
    def verifier(self) -> str:
        return "token" if self.decoding is None else self.decoding.verifier

    @property
    def head(self) -> str | None:
        """The acceptance-head file the setting decodes with (None for settings without a head)."""
        return None if self.decoding is None else self.decoding.head

    @property
    def fast(self) -> bool:
        """Decoded on the fast path (its family suffixed with `FAST_SUFFIX`)."""
        return self.decoding is not None and self.decoding.path == "fast"

    @property
    def _named(self) -> str:
        base = eager_family(self.family)
        if self.decoding is not None and self.head is not None and self.decoding.name != base:
            name = f"{base} {self.spec}"
        else:
            name = self.spec or base
        return f"{name} [fast]" if self.fast else name

    @property
    def key(self) -> str:
        return re.sub(r"[^A-Za-z0-9.=-]+", "_", f"{self._named}-{self.verifier}")

    @property
    def label(self) -> str:
        return self._named


def base_family(family: str) -> str:
    """A method family without its head suffix: "specdecpp-lookahead[greedy-r1]" -> "specdecpp-lookahead"."""
    return family.split("[", 1)[0]


def is_fitted(family: str) -> bool:
    """True if the family's per-prompt wall times enter the (eager) cost fit (`FIT_FAMILIES`)."""
    return base_family(family) in FIT_FAMILIES


def is_fast(family: str) -> bool:
    """True for a fast-path row's family ("specdec@fast")."""
    return family.endswith(FAST_SUFFIX)


def fast_family(family: str) -> str:
    """The family of a setting's fast-path copy: "specdec" -> "specdec@fast"."""
    return family + FAST_SUFFIX


def eager_family(family: str) -> str:
    """The family a fast-path row copies: "specdec@fast" -> "specdec" (other families unchanged)."""
    return family.removesuffix(FAST_SUFFIX)


def is_specdecpp(family: str) -> bool:
    """True for the h-grid family of a SpecDec++ head, of either kind."""
    return base_family(family) in HEAD_FAMILIES.values()


def head_kind_of(family: str) -> str | None:
    """The head kind ("candidate", "lookahead") of a SpecDec++ family; None for other families."""
    return next((k for k, f in HEAD_FAMILIES.items() if f == base_family(family)), None)


def head_name(path: str | Path) -> str:
    """A head's short name: its directory for ".../<name>/head.safetensors", else the file's stem."""
    from acchead.head_io import HEAD_FILENAME

    p = Path(path)
    return p.parent.name if p.name == HEAD_FILENAME else p.stem


def resolve_head_path(text: str | Path) -> Path:
    """A `--head` entry as a file path: a directory means the `head.safetensors` inside it."""
    from acchead.head_io import HEAD_FILENAME

    p = Path(text).expanduser()
    return p / HEAD_FILENAME if p.is_dir() else p


def head_families(heads: Sequence[str | Path]) -> list[tuple[str, Path, str]]:
    """(family, head file, kind) for each `--head` entry, in order; reads the metadata only, not weights.

    A candidate head's family is "specdecpp", a lookahead head's "specdecpp-lookahead"; when two heads would
    get the same family, each of them is suffixed with its `head_name` ("specdecpp-lookahead[greedy-r1]").
    AccheadError for a missing or unreadable head file, or a head listed twice.
    """
    from acchead.head_io import read_head_metadata

    entries: list[tuple[Path, str]] = []
    for text in heads:
        path = resolve_head_path(text)
        if not path.is_file():
            raise AccheadError(f"head file does not exist: {path}")
        if any(path.resolve() == p.resolve() for p, _ in entries):
            raise AccheadError(f"--head lists {path} twice")
        kind = read_head_metadata(path).kind
        if kind not in HEAD_FAMILIES:
            raise AccheadError(f"{path}: unknown head kind {kind!r}; expected {' or '.join(HEAD_FAMILIES)}")
        entries.append((path, kind))
    counts: dict[str, int] = {}
    for _, kind in entries:
        counts[HEAD_FAMILIES[kind]] = counts.get(HEAD_FAMILIES[kind], 0) + 1
    out: list[tuple[str, Path, str]] = []
    used: set[str] = set()
    for path, kind in entries:
        family = HEAD_FAMILIES[kind]
        if counts[family] > 1:
            name, n = head_name(path), 1
            family = f"{HEAD_FAMILIES[kind]}[{name}]"
            while family in used:  # same directory names in different places
                n += 1
                family = f"{HEAD_FAMILIES[kind]}[{name}-{n}]"
        used.add(family)
        out.append((family, path, kind))
    return out


def used_heads(args: argparse.Namespace, settings: Sequence[Setting]) -> list[tuple[str, Path, str]]:
    """`head_families(args.head)` restricted to the heads some setting decodes with (in `--head` order)."""
    wanted = {s.head for s in settings if s.head is not None}
    if not wanted:
        return []
    return [(f, p, k) for f, p, k in head_families(args.head) if str(p) in wanted]


def build_settings(args: argparse.Namespace, sampling: SamplingConfig) -> tuple[list[Setting], list[str]]:
    """Expand the method list and grids into settings, in report order; returns (settings, notes).

    Every head in `args.head` expands the h-grid into its own family (`head_families`); extra specs that
    use SpecDec++ decode with the first head. Reads the heads' metadata (not their weights).
    """
    v = args.verifier
    settings: list[Setting] = []
    notes: list[str] = []
    methods = args.methods

    def add(family: str, policy: Any, params: dict[str, Any], head: str | None = None) -> None:
        settings.append(Setting(family, DecodingSpec(policy, verifier=v, path="eager", head=head), params))

    if "autoregressive" in methods:
        add("autoregressive", AutoregressiveSpec(), {})
    for k in args.k_grid if "specdec" in methods else ():
        add("specdec", SpecDecSpec(k=k), {"k": k})
    extra_specs = args.extra_specs if "extra" in methods else []
    extras = [DecodingSpec.from_spec(x, verifier=v, path="eager") for x in extra_specs]
    heads = head_families(args.head) if "specdecpp" in methods or any(e.needs_head for e in extras) else []
    if "specdecpp" in methods:
        cap = args.specdecpp_max
        for family, path, _ in heads:  # one family per head: its kind, suffixed if two would collide
            for priced, h in itertools.product([r == "priced" for r in args.specdecpp_rules], args.h_grid):
                params = {"h": h, "max": cap, "head": str(path)} | ({"priced": 1} if priced else {})
                add(family, SpecDecPPSpec(h=h, max=cap, priced=priced or None), params, str(path))
        if not heads:
            notes.append("no SpecDec++ rows: the pair ships no head trained under this S (pass --head)")
    for t in args.tau_grid if "confidence" in methods else ():
        add("confidence", ConfidenceSpec(tau=t), {"tau": t})
    for t in args.entropy_tau_grid if "entropy" in methods else ():
        add("entropy", EntropySpec(tau=t), {"tau": t})
    g = args.adaedl_gamma
    for family, adapt, grid in (("adaedl", False, args.adaedl_lam_grid),
                                ("adaedl-adapt", True, args.adaedl_adapt_grid)):  # fmt: skip
        for lam in grid if family in methods else ():
            add(family, AdaEDLSpec(gamma=g, lam=lam, adapt=adapt), {"gamma": g, "lam": lam})
    if "oracle" in methods:
        if sampling.greedy:
            add("oracle", OracleSpec(), {})
        else:
            notes.append(f"oracle skipped: it is defined for greedy decoding only (sampling is {sampling}).")
    if "hf-assisted" in methods:
        from acchead.inference.bench.hf_assisted import METHOD

        settings.append(Setting(METHOD, None))
    if "hf-generate" in methods:
        from acchead.inference.bench.hf_assisted import GENERATE_METHOD

        settings.append(Setting(GENERATE_METHOD, None))
    if "hf-custom" in methods:
        settings.append(hf_custom_setting(settings, v))
    for extra in extras:  # a bandit arm or cascade using SpecDec++ decodes with the first head
        head = str(heads[0][1]) if extra.needs_head else None
        params = {"spec": extra.to_spec()} | ({"head": head} if head else {})
        settings.append(Setting(extra.name, replace(extra, head=head), params))
    if not settings:
        raise AccheadError("nothing to run: --methods selects no setting")
    return _on_paths(settings, args.paths), notes


def hf_custom_setting(settings: Sequence[Setting], verifier: str) -> Setting:
    """The `hf-custom` row: one of `settings` (its twin) decoded through transformers' `generate`
    (`acchead.inference.bench.hf_custom`), so that the two rows' wall clocks give the wrapper's cost.

    The twin is the first SpecDec++ head's h = 0.8 (else its first h), else fixed K = 3 (else the first K),
    else autoregressive decoding (with `verifier`); its family is kept in the row's params as "twin".
    """
    from acchead.inference.bench.hf_custom import METHOD

    twin = None
    for keep, key, value in ((is_specdecpp, "h", 0.8), (lambda f: f == "specdec", "k", 3)):
        group = [s for s in settings if keep(s.family)]
        group = [s for s in group if s.family == group[0].family] if group else []  # the first head only
        if group:
            twin = next((s for s in group if s.params.get(key) == value), group[0])
            break
    if twin is None:
        twin = Setting("autoregressive", DecodingSpec(AutoregressiveSpec(), verifier=verifier, path="eager"))
    return Setting(METHOD, twin.decoding, {"twin": twin.family, **twin.params})


def _on_paths(settings: list[Setting], paths: Sequence[str]) -> list[Setting]:
    """The settings on the requested paths: the draft-model decoders (fitted families, and copy rounds
    beside them) once per path, the rest (oracle, Hugging Face, model-free drafters, bandits) once, eager."""

    def per_path(s: Setting) -> bool:
        return s.decoding is not None and (is_fitted(s.family) or isinstance(s.decoding.drafter, CopySpec))

    out = [s for s in settings if "eager" in paths or not per_path(s)]
    if "fast" in paths:
        out += [
            replace(s, family=fast_family(s.family), decoding=replace(s.decoding, path="fast"))
            for s in settings
            if per_path(s)
        ]
    return out
