"""Bench report logic: best settings, the issue's goals judged from rows, and the greedy agreement check."""

from __future__ import annotations

import pytest

from inference.bench_report import (
    _greedy_agreement,
    best_by_family,
    evaluate_goals,
    hf_cross_check,
    render_report,
)
from inference.head_timing import HeadOverhead


def _row(method: str, modeled: float, wall: float, **params) -> dict:
    return {"method": method, "params": params, "spec": f"{method}:{params}", "modeled_tokens_per_s": modeled,
            "wall_tokens_per_s": wall}  # fmt: skip


def _rows(pp: float, sd: float, cf: float, sd_wall: float, hf_wall: float) -> list[dict]:
    return [
        _row("autoregressive", 10.0, 10.0),
        _row("specdec", sd - 1, sd_wall + 5, k=2),  # lower modelled but faster wall: best-by-wall is used
        _row("specdec", sd, sd_wall, k=4),
        _row("specdecpp", pp, 1.0, h=0.5),
        _row("confidence", cf, 1.0, tau=0.4),
        _row("hf-assisted", 1.0, hf_wall),
    ]


def test_best_by_family_picks_highest_modelled_throughput():
    best = best_by_family(_rows(12.0, 11.0, 9.0, 5.0, 4.0))
    assert list(best) == ["autoregressive", "specdec", "specdecpp", "confidence", "hf-assisted"]
    assert best["specdec"]["params"] == {"k": 4}


@pytest.mark.parametrize(
    ("pp", "cf", "sd_wall", "hf_wall", "ratio", "expected"),
    [
        (12.2, 9.0, 5.0, 4.0, 0.02, [True, True, True]),
        (12.0, 9.0, 5.0, 11.0, 0.05, [False, False, False]),  # 1.09× only; HF faster; head too slow
        (12.2, 12.5, 5.0, 4.0, 0.02, [False, True, True]),  # ≥ 1.10× SpecDec but below confidence
    ],
)
def test_goals_are_judged_from_the_rows(pp, cf, sd_wall, hf_wall, ratio, expected):
    overhead = HeadOverhead(head_s=ratio * 1e-3, draft_step_s=1e-3, ratio=ratio, calls=10, context=5)
    goals = evaluate_goals(_rows(pp, 11.0, cf, sd_wall, hf_wall), overhead)
    assert [met for _, met, _ in goals] == expected


def test_goals_not_measured_are_reported_as_such():
    goals = evaluate_goals([_row("autoregressive", 10.0, 10.0)], None)
    assert [met for _, met, _ in goals] == [None, None, None]


def test_greedy_agreement_share():
    rows = [{"method": "autoregressive", "outputs": ["a", "b"]}, {"method": "specdec", "outputs": ["a", "c"]}]
    _greedy_agreement(rows, greedy=True)
    assert [r["matches_autoregressive"] for r in rows] == [1.0, 0.5]
    rows = [{"method": "autoregressive", "outputs": ["a"]}, {"method": "specdec", "outputs": ["b"]}]
    _greedy_agreement(rows, greedy=False)
    assert [r["matches_autoregressive"] for r in rows] == [None, None]


def test_report_escapes_bandit_arms_in_tables():
    row = _row("ucb", 5.0, 5.0, spec="ucb:arms=specdec:k=2|specdec:k=4")
    row.update(tokens=10, target_calls=5, draft_calls=5, discarded=0, verification_rate=0.5, discard_rate=0.0,
               modeled_speedup=None, wall_speedup=None, matches_autoregressive=None)  # fmt: skip
    results = {
        "rows": [row], "config": {"prompts": "p", "n_prompts": 1, "max_new_tokens": 8, "seed": 0,
        "device": "cpu", "dtype": "float32", "verifier": "token", "target": "t", "draft": "d", "head": "h"},
        "sampling": {"temperature": 0.0, "top_k": 0, "top_p": 1.0}, "t_draft": 1e-3, "t_target": 2e-3,
        "r2": 0.9, "fit": {"n_runs": 3}, "goals": [], "notes": ["a note"],
    }  # fmt: skip
    text = render_report(results)
    assert "k=2\\|specdec" in text and "a note" in text
    # 8 columns in the best-settings table, 9 in the full one: 9 or 10 unescaped pipes per row.
    cells = [line.count("|") - line.count("\\|") for line in text.splitlines() if line.startswith("| ucb")]
    assert cells == [9, 10]


def test_hf_cross_check_compares_with_the_equivalent_confidence_setting():
    counts = {
        "tokens": 40,
        "target_calls": 20,
        "draft_calls": 30,
        "discarded": 10,
        "matches_autoregressive": 1.0,
        "wall_tokens_per_s": 8.0,
    }
    hf_params = {"num_assistant_tokens": 20, "confidence_threshold": 0.4, "adaptive_threshold": False}
    hf = {"method": "hf-assisted", "params": hf_params, **counts}
    twin = {"method": "confidence", "params": {"tau": 0.4}, **counts}
    assert "agree: 40/20/30/10. Same schedule, wall clock: ours 10.0 vs HF 8.0 tokens/s (1.25×)." in (
        hf_cross_check([twin | {"wall_tokens_per_s": 10.0}, hf])
    )
    assert "DIFFER" in hf_cross_check([twin | {"draft_calls": 31}, hf])
    assert hf_cross_check([twin | {"params": {"tau": 0.5}}, hf]) is None
    assert hf_cross_check([twin, hf | {"matches_autoregressive": None}]) is None  # sampling: no check
