"""The bench's result rows: one per method and setting, summed over the prompts, typed.

`MeasuredRow` is what the runner hands over (the summed counts and output digests of one setting);
`price_rows` turns the measured rows into `BenchRow`s, each priced against autoregressive decoding, at the
fitted costs and at every declared cost ratio c = t_draft / t_target, and checked against autoregressive's
outputs. `results.json` keeps a row as `BenchRow.to_dict()` (its keys are the fields, in order); the report
reads rows back with `BenchRow.from_dict`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from acchead.inference.bench.costmodel import Metrics, ratio_speedup
from acchead.inference.bench.settings import eager_family, head_name


@dataclass(frozen=True)
class MeasuredRow:
    """One setting's runs over all prompts, before pricing.

    method: the method family ("specdec", "specdecpp-lookahead", "specdec@fast", ...).
    params: the setting's parameters ({"k": 4}; a SpecDec++ row's "head" is the head file's path).
    spec: the policy spec the setting decoded with ("" for transformers' own generate loops).
    metrics: the summed counts, rates and both throughputs (`costmodel.aggregate`).
    outputs: a digest of each prompt's output, in prompt order (for the greedy agreement check).
    """

    method: str
    params: dict[str, Any]
    spec: str
    metrics: Metrics
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class BenchRow:
    """One row of `results.json`: a setting's counts, rates and speedups over all prompts.

    Counts are sums over the prompts: tokens N, target_calls N_target, draft_calls N_draft, discarded
    N_discarded, wall_time in seconds. Rates: verification_rate = N_target / N, discard_rate =
    N_discarded / N. modeled_tokens_per_s is eq. 2.3 at the fitted unit costs of the row's path;
    wall_tokens_per_s is N / wall_time. modeled_speedup and wall_speedup divide them by autoregressive's
    (None without an autoregressive row). ratio_speedups maps a declared ratio's key (`f"{c:g}"`) to the
    modelled speedup N / (c·N_draft + N_target). matches_autoregressive is the share of prompts whose
    output equals autoregressive's, under greedy decoding only (None under sampling, where outputs differ
    legitimately, or without an autoregressive row).
    """

    method: str
    params: dict[str, Any]
    spec: str
    tokens: int
    target_calls: int
    draft_calls: int
    discarded: int
    wall_time: float
    verification_rate: float
    discard_rate: float
    modeled_tokens_per_s: float
    wall_tokens_per_s: float
    n_prompts: int
    matches_autoregressive: float | None = None
    modeled_speedup: float | None = None
    wall_speedup: float | None = None
    ratio_speedups: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The row as `results.json` stores it."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BenchRow:
        """A row read back from `results.json` (keys that are not fields are ignored)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def speedup_at(self, key: str) -> float:
        """The modelled speedup at the declared ratio `key` ("0.2")."""
        return self.ratio_speedups[key]


def ratio_keys(ratios: Sequence[float]) -> dict[str, float]:
    """Declared ratios by their key in `ratio_speedups` (`f"{c:g}"`); the first of duplicates is kept."""
    keys: dict[str, float] = {}
    for c in ratios:
        keys.setdefault(f"{c:g}", float(c))
    return keys


def _agreement(outputs: Sequence[str], reference: Sequence[str] | None) -> float | None:
    if reference is None:
        return None
    return sum(a == b for a, b in zip(outputs, reference, strict=True)) / len(reference)


def price_rows(measured: Sequence[MeasuredRow], ratios: Sequence[float], greedy: bool) -> list[BenchRow]:
    """The measured rows priced against the autoregressive row (the first `autoregressive` one, if any):
    speedups at the fitted costs and on the wall clock, at each declared ratio, and (greedy only) the share
    of prompts whose output equals autoregressive's. A bench of the fast path alone prices against its
    `autoregressive@fast` row."""
    ar = next((m for m in measured if eager_family(m.method) == "autoregressive"), None)
    reference = ar.outputs if ar is not None and greedy else None
    keys = ratio_keys(ratios)
    rows = []
    for m in measured:
        x = m.metrics
        rows.append(
            BenchRow(
                method=m.method,
                params=m.params,
                spec=m.spec,
                **asdict(x),
                n_prompts=len(m.outputs),
                matches_autoregressive=_agreement(m.outputs, reference),
                modeled_speedup=x.modeled_tokens_per_s / ar.metrics.modeled_tokens_per_s if ar else None,
                wall_speedup=x.wall_tokens_per_s / ar.metrics.wall_tokens_per_s if ar else None,
                ratio_speedups={
                    key: ratio_speedup(x.tokens, x.draft_calls, x.target_calls, c) for key, c in keys.items()
                },
            )
        )
    return rows


def fmt_params(params: Mapping[str, Any]) -> str:
    """`k=4, h=0.8` for a markdown table cell ('|' in bandit arm lists escaped; a head path by its name)."""
    text = ", ".join(
        f"{k}={v:g}" if isinstance(v, float) else f"{k}={head_name(v)}" if k == "head" else f"{k}={v}"
        for k, v in params.items()
    )
    return text.replace("|", "\\|") or "-"


def who(row: BenchRow) -> str:
    """A row named in a goal's detail: `specdec k=4`."""
    return f"{row.method} {fmt_params(row.params)}"
