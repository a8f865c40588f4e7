"""A model-free or cascaded drafter as a typed value: the DRAFTER of a `DRAFTER+POLICY` spec and of a bandit
arm's `DRAFTER@POLICY`.

    mag[:block=10]              MaGSpec: Max-Gram alone (copies the context; one-hot q, no model forwards)
    cascade:k=4.2/10[,l=1]      CascadeSpec: the draft reviewing MaG's proposals (rows "a.b/c"), leniency l
    copy[:min=3,block=16]       CopySpec: the draft model's rounds, or a copy of the context where its suffix
                                recurs (`acchead.inference.copy_drafter`)

`parse_drafter_spec` checks a string when a spec is parsed, before any model loads;
`acchead.inference.cascade.make_drafter` builds MaG and cascades from the typed value, the decoder copy
rounds. `to_spec` writes the string back, defaults left out, so `parse_drafter_spec(d.to_spec()) == d`.
Pure data: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from acchead.errors import AccheadError
from acchead.inference.policy_spec import format_number


@dataclass(frozen=True)
class MaGSpec:
    """Max-Gram drafting `block` candidates per lookup (`acchead.inference.mag.MaGDrafter`)."""

    block: int = 10
    name: ClassVar[str] = "mag"
    needs_bigram: ClassVar[bool] = True  # MaG's table fills what the context's copy leaves

    def __post_init__(self) -> None:
        if self.block < 1:
            raise AccheadError(f"mag block must be >= 1, got {self.block}")

    def to_spec(self) -> str:
        return "mag" if self.block == 10 else f"mag:block={self.block}"


@dataclass(frozen=True)
class CascadeSpec:
    """The draft model reviewing MaG (`acchead.inference.cascade.CascadeDrafter`): `k` the step-limit rows
    (e.g. ((4, 2), (10,)) for "4.2/10"), `leniency` l of the review's acceptance min(1, l·p/r)."""

    k: tuple[tuple[int, ...], ...]
    leniency: float = 1.0
    name: ClassVar[str] = "cascade"
    needs_bigram: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if not self.k or any(not row or min(row) < 1 for row in self.k):
            raise AccheadError(f"cascade k needs rows of positive step limits, got {self.k}")
        if self.leniency <= 0:
            raise AccheadError(f"cascade leniency l must be > 0, got {self.leniency}")

    def to_spec(self) -> str:
        rows = "/".join(".".join(str(x) for x in row) for row in self.k)
        return f"cascade:k={rows}" + ("" if self.leniency == 1.0 else f",l={format_number(self.leniency)}")


@dataclass(frozen=True)
class CopySpec:
    """Copy rounds (`acchead.inference.copy_drafter.CopyDrafter`): a suffix match of at least `min_match`
    tokens copies up to `block` candidates; in a batch (`acchead.inference.batched_copy`) a round over R rows
    copies up to `row_block(R)` = min(block, max(2, `batch_budget` // R)) per row, since a copying row widens
    all R rows' verification (docs/batched.md, "Copy rounds in a batch"). Spec string
    `copy[:min=3,block=16,batch=16]`, before a policy: `copy+specdecpp:h=0.9`."""

    min_match: int = 3
    block: int = 16
    batch_budget: int = 16
    name: ClassVar[str] = "copy"
    needs_bigram: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if min(self.min_match, self.block, self.batch_budget) < 1:
            raise AccheadError(f"copy needs min, block and batch >= 1, got min={self.min_match}, "
                               f"block={self.block}, batch={self.batch_budget}")  # fmt: skip

    def row_block(self, rows: int) -> int:
        """The most candidates a row copies in a round verifying `rows` rows: the round's positions R·W stay
        within `batch_budget`, but at least 2 (a copy of one token displaced a draft round of more: at B = 16
        it took more target forwards than K = 2 without copying), and at most `block`."""
        return min(self.block, max(2, self.batch_budget // max(rows, 1)))

    def to_spec(self) -> str:
        params = []
        if self.min_match != 3:
            params.append(f"min={self.min_match}")
        if self.block != 16:
            params.append(f"block={self.block}")
        if self.batch_budget != 16:
            params.append(f"batch={self.batch_budget}")
        return "copy" + (":" + ",".join(params) if params else "")


DrafterSpec = MaGSpec | CascadeSpec | CopySpec


def parse_k(text: str) -> tuple[tuple[int, ...], ...]:
    """Step-limit matrix from a compact string: rows split by '/', entries by '.', e.g. "4.2/10"."""
    try:
        return tuple(tuple(int(v) for v in row.split(".")) for row in text.split("/"))
    except ValueError:
        raise AccheadError(f"cannot parse cascade k {text!r}: expected rows like '4.2/10'") from None


def parse_drafter_spec(text: str) -> DrafterSpec:
    """The typed drafter of `mag[:block=N]`, `cascade:k=ROWS[,l=L]` or `copy[:min=M,block=N,batch=N]`;
    one-line AccheadError if malformed."""
    name, _, body = text.strip().partition(":")
    params: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in body.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise AccheadError(f"cannot parse drafter {text!r}: expected key=value, got {item!r}")
        params[key.strip()] = value.strip()
    allowed = {"mag": {"block"}, "cascade": {"k", "l"}, "copy": {"min", "block", "batch"}}.get(name.strip())
    if allowed is None:
        raise AccheadError(
            f"unknown drafter {name!r} in {text!r}; expected mag[:block=N], cascade:k=... or "
            "copy[:min=M,block=N,batch=N]"
        )
    if set(params) - allowed:
        raise AccheadError(f"drafter {name!r} takes {', '.join(sorted(allowed))}; got {text!r}")
    try:
        if name.strip() == "mag":
            return MaGSpec(int(params.get("block", 10)))
        if name.strip() == "copy":
            values = (params.get("min", 3), params.get("block", 16), params.get("batch", 16))
            return CopySpec(*map(int, values))
        if "k" not in params:
            raise AccheadError(f"drafter {text!r} needs k=ROWS, e.g. cascade:k=4.2/10")
        return CascadeSpec(parse_k(params["k"]), float(params.get("l", 1.0)))
    except ValueError:
        raise AccheadError(
            f"cannot parse drafter {text!r}: block, min, batch: integers; l: a number"
        ) from None


def as_drafter_spec(spec: str | DrafterSpec) -> DrafterSpec:
    """`spec` as a typed value (parsed when a string)."""
    return parse_drafter_spec(spec) if isinstance(spec, str) else spec
