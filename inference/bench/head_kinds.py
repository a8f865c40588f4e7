"""The bench's comparison of SpecDec++ head kinds: each head's best threshold h per cost column, and which
kind (candidate: the paper's head; lookahead: ours) wins by how much. `results.json` keeps it under
`head_kinds`; the report renders it as its own section.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from acchead.inference.bench.goals import at_ratio, best_row, fitted
from acchead.inference.bench.rows import BenchRow, fmt_params
from acchead.inference.bench.settings import head_kind_of, head_name, is_specdecpp


def compare_head_kinds(rows: Sequence[BenchRow], ratio_keys: list[str]) -> dict[str, Any] | None:
    """Per SpecDec++ head (family): the best setting at each declared ratio and at the fitted costs; per
    column, which head kind wins and by how much. None without SpecDec++ rows.

    Returns `{"columns": [...], "heads": {family: {"kind", "head", "best": {column: {"params", "score"}}}},
    "winners": {column: {...} or None}}`; a column is a ratio key ("0.2": score = speedup over
    autoregressive at that c) or "fitted" (score = modelled tokens/s). A winner compares the best head of
    each kind: `{"kind", "family", "score", "other_kind", "other_family", "other_score", "margin"}`
    (margin = score / other_score); None when only one kind ran.
    """
    families = list(dict.fromkeys(r.method for r in rows if is_specdecpp(r.method)))
    if not families:
        return None
    columns = [*ratio_keys, "fitted"]
    scores = {k: at_ratio(k) for k in ratio_keys} | {"fitted": fitted}
    heads: dict[str, dict[str, Any]] = {}
    for fam in families:
        best = {}
        for col in columns:
            r = best_row(rows, lambda m, fam=fam: m == fam, scores[col])
            assert r is not None  # the family has rows: it was taken from them
            params = {k: v for k, v in r.params.items() if k != "head"}
            best[col] = {"params": params, "score": scores[col](r)}
        first = next(r for r in rows if r.method == fam)
        heads[fam] = {"kind": head_kind_of(fam), "head": first.params.get("head"), "best": best}
    winners = {col: _winner(heads, col) for col in columns}
    return {"columns": columns, "heads": heads, "winners": winners}


def _winner(heads: dict[str, dict[str, Any]], col: str) -> dict[str, Any] | None:
    """The best head of each kind in column `col`, the winning kind first; None with one kind."""
    by_kind: dict[str, tuple[str, float]] = {}
    for fam, h in heads.items():
        sc = h["best"][col]["score"]
        if h["kind"] not in by_kind or sc > by_kind[h["kind"]][1]:
            by_kind[h["kind"]] = (fam, sc)
    if len(by_kind) < 2:
        return None
    (k1, (f1, s1)), (k2, (f2, s2)) = sorted(by_kind.items(), key=lambda kv: -kv[1][1])[:2]
    return {"kind": k1, "family": f1, "score": s1, "other_kind": k2, "other_family": f2, "other_score": s2,
            "margin": s1 / s2 if s2 > 0 else None}  # fmt: skip


def kind_lines(kinds: dict[str, Any] | None) -> list[str]:
    """One sentence per column saying which head kind wins by how much (for the summary and report)."""
    out = []
    for col, w in ((kinds or {}).get("winners") or {}).items():
        if w is None:
            continue
        where = "at the fitted costs" if col == "fitted" else f"at c = {col}"
        unit = " tok/s" if col == "fitted" else "×"
        margin = "" if w["margin"] is None else f" by {w['margin']:.3f}×"
        out.append(
            f"head kinds {where}: {w['kind']} ({w['family']}) wins{margin}, {w['score']:.3f}{unit} vs "
            f"{w['other_score']:.3f}{unit} for {w['other_kind']} ({w['other_family']})"
        )
    return out


def render_head_kinds(kinds: dict[str, Any] | None) -> list[str]:
    """The report's head-kind section: each head's best h per column, then which kind wins by how much."""
    if not kinds:
        return []
    cols = kinds["columns"]
    names = {c: "fitted costs (modelled tok/s)" if c == "fitted" else f"c = {c}" for c in cols}
    lines = [
        "",
        "## SpecDec++ head kinds",
        "",
        "Best setting of each acceptance head at each declared cost ratio (modelled speedup over "
        "autoregressive) and at the fitted costs (modelled tokens/s). A candidate head (the paper's) judges "
        "Y_k from the state after Y_k is fed; a lookahead head judges it from the state that produced q_k.",
        "",
        "| method | kind | head" + "".join(f" | {names[c]}" for c in cols) + " |",
        "|---|---|---" + "|---" * len(cols) + "|",
    ]
    for fam, h in kinds["heads"].items():
        cells = ""
        for c in cols:
            b = h["best"][c]
            value = f"{b['score']:.1f}" if c == "fitted" else f"{b['score']:.2f}×"
            cells += f" | {value} ({fmt_params(b['params'])})"
        head = "-" if h["head"] is None else head_name(h["head"])
        lines.append(f"| {fam} | {h['kind']} | {head}{cells} |")
    winners = kind_lines(kinds)
    if winners:
        lines += ["", *[f"- {w[0].upper()}{w[1:]}" for w in winners]]
    else:
        lines += ["", "- Only one head kind ran: no comparison between kinds."]
    return lines
