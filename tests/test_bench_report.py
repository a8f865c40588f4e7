"""Bench report logic: best settings, the issue's goals judged from rows, and the greedy agreement check."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import pytest

from acchead.errors import AccheadError
from acchead.inference.bench.costmodel import CostFit, Metrics
from acchead.inference.bench.goals import best_by_family, evaluate_goals, overhead_goal
from acchead.inference.bench.head_kinds import compare_head_kinds, kind_lines
from acchead.inference.bench.head_timing import HeadOverhead
from acchead.inference.bench.pareto import legend_label, plot_pareto
from acchead.inference.bench.report import build_results, hf_cross_check, render_report
from acchead.inference.bench.rows import BenchRow, MeasuredRow, price_rows
from acchead.inference.bench.run import base_fit
from acchead.inference.bench.thresholds import GoalThresholds
from acchead.sampling import SamplingConfig

GOALS = GoalThresholds.shipped()  # configs/bench.yaml: the thresholds the tests below name


def _row(method: str, modeled: float, wall: float, **params) -> BenchRow:
    return BenchRow(method=method, params=params, spec=f"{method}:{params}", tokens=40, target_calls=20,
                    draft_calls=30, discarded=10, wall_time=1.0, verification_rate=0.5, discard_rate=0.25,
                    modeled_tokens_per_s=modeled, wall_tokens_per_s=wall, n_prompts=1)  # fmt: skip


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
    assert best["specdec"].params == {"k": 4}


def _at(method: str, speedup: float, modeled: float | None = None, wall: float = 1.0, **params) -> BenchRow:
    """A row priced at c = 0.2 (`ratio_speedups`, as `price_rows` stores it) and at fitted costs."""
    r = _row(method, 10.0 * speedup if modeled is None else modeled, wall, **params)
    return replace(r, ratio_speedups={"0.2": speedup, "0.1": speedup + 0.5})


def _goal_rows(la: float = 1.55, sd: float = 1.30, cf: float = 1.45, ada: float = 1.46,
               oracle: float = 2.0) -> list[dict]:  # fmt: skip
    return [
        _at("autoregressive", 1.0),
        _at("specdec", sd - 0.1, k=4),
        _at("specdec", sd, k=2),
        _at("specdecpp", 1.40, h=0.3, head="/z/greedy-candidate/head.safetensors"),
        _at("specdecpp", 1.35, h=0.5, head="/z/greedy-candidate/head.safetensors"),
        _at("specdecpp-lookahead", la, h=0.6, head="/z/greedy-lookahead/head.safetensors"),
        _at("specdecpp-lookahead", la - 0.2, h=0.2, head="/z/greedy-lookahead/head.safetensors"),
        _at("confidence", cf, tau=0.4),
        _at("adaedl", ada - 0.05, gamma=0.2, lam=0.5),
        _at("adaedl-adapt", ada, gamma=0.2, lam=0.1),
        _at("oracle", oracle),
        _at("hf-assisted", 1.0, wall=0.5),
        _custom(_at("specdecpp", 1.35, h=0.5, head="/z/greedy-candidate/head.safetensors"), wall=0.97),
    ]


def _custom(twin: BenchRow, wall: float) -> BenchRow:
    """The hf-custom row of `twin` (its setting decoded through generate), at wall-clock `wall` tokens/s."""
    r = _at("hf-custom", twin.ratio_speedups["0.2"], wall=wall, twin=twin.method, **twin.params)
    return replace(r, spec=twin.spec)


def _overheads(*ratios: float) -> dict[str, HeadOverhead]:
    fams = ("specdecpp", "specdecpp-lookahead")
    return {f: HeadOverhead(head_s=r * 1e-3, draft_step_s=1e-3, ratio=r, calls=10, context=5)
            for f, r in zip(fams, ratios, strict=False)}  # fmt: skip


def test_greedy_goals_are_judged_from_the_rows():
    goals = evaluate_goals(_goal_rows(), _overheads(0.02, 0.05), True, GOALS)
    names = [g for g, _, _ in goals]
    assert names[:5] == [
        "greedy: best SpecDec++ ≥ 1.15× best fixed K at c = 0.2",
        "greedy: best SpecDec++ ≥ 1.15× best fixed K at the fitted costs",
        "greedy: best SpecDec++ ≥ 1.05× best confidence threshold at c = 0.2",
        "greedy: best SpecDec++ ≥ 1.05× best AdaEDL setting at c = 0.2",
        "greedy: best SpecDec++ captures ≥ 35% of the fixed-K-to-oracle gap at c = 0.2",
    ]
    assert names[5].startswith("our best fixed-K SpecDec wall-clock")
    assert names[6].startswith("our decoder through transformers' generate keeps ≥ 0.95×")
    assert names[7:] == ["head overhead ≤ 3% of a draft step (specdecpp)",
                         "head overhead ≤ 3% of a draft step (specdecpp-lookahead)"]  # fmt: skip
    # 1.55 / 1.30 = 1.19; 1.55 / 1.45 = 1.07; 1.55 / 1.46 = 1.06; (1.55 - 1.3) / (2 - 1.3) = 36%.
    assert [m for _, m, _ in goals] == [True, True, True, True, True, True, True, True, False]
    details = [d for _, _, d in goals]
    # Best SpecDec++ is taken over both head kinds (the lookahead head here), named by its head.
    assert details[0] == ("1.550× (specdecpp-lookahead h=0.6, head=greedy-lookahead) vs 1.300× "
                          "(specdec k=2): 1.192×")  # fmt: skip
    assert "vs 1.460× (adaedl-adapt gamma=0.2, lam=0.1)" in details[3]  # AdaEDL: either family
    assert details[4].startswith("35.7% of the gap (SpecDec++ 1.550×, fixed K 1.300×, oracle 2.000×")
    assert details[6].startswith("0.97 vs 1.00 tokens/s (specdecpp ") and details[6].endswith("): 0.970×")
    assert details[8].startswith("5.00% (50 µs head vs 1000 µs draft step")


def test_a_run_of_the_fast_path_alone_is_judged_on_its_fast_rows():
    """`--paths fast` names every decoder's row NAME@fast: the counted goals read them (they are judged,
    not "not measured"), and where both paths ran each family's eager rows are read, never both."""
    eager = _goal_rows()
    fast = [r if r.method.startswith("hf-") else replace(r, method=r.method + "@fast") for r in eager]
    want = evaluate_goals(eager, None, True, GOALS)
    got = evaluate_goals(fast, None, True, GOALS)
    assert [m for _, m, _ in got[:5]] == [m for _, m, _ in want[:5]] == [True] * 5
    assert got[0][2] == want[0][2].replace("specdecpp-lookahead h", "specdecpp-lookahead@fast h").replace(
        "(specdec k", "(specdec@fast k")
    better = [replace(r, ratio_speedups={k: v * 2 for k, v in r.ratio_speedups.items()}) for r in fast]
    both = evaluate_goals(eager + [r for r in better if r.method.endswith("@fast")], None, True, GOALS)
    assert [d for _, _, d in both[:5]] == [d for _, _, d in want[:5]]  # the eager rows, not the doubled fast


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({"la": 1.45}, [False, False, False, False, False]),  # 1.12× K; 1.0× confidence; 21% of the gap
        ({"la": 1.50, "cf": 1.20, "ada": 1.20}, [True, True, True, True, False]),  # 29% of the gap only
        ({"sd": 1.39}, [False, False, True, True, False]),  # 1.115× K; (1.55 - 1.39) / 0.61 = 26%
    ],
)
def test_greedy_goals_not_met(kw, expected):
    goals = evaluate_goals(_goal_rows(**kw), _overheads(0.01), True, GOALS)
    assert [m for _, m, _ in goals[:5]] == expected


def test_sampling_goals_are_judged_from_the_rows():
    rows = [r for r in _goal_rows() if r.method != "oracle"]  # no oracle under sampling
    goals = evaluate_goals(rows, _overheads(0.01, 0.02), False, GOALS)
    assert [g for g, _, _ in goals[:3]] == [
        "sampling: best SpecDec++ ≥ 1.08× best fixed K at c = 0.2",
        "sampling: best SpecDec++ above the best confidence threshold at c = 0.2",
        "sampling: best SpecDec++ above the best AdaEDL setting at c = 0.2",
    ]
    assert [m for _, m, _ in goals] == [True, True, True, True, True, True, True]
    # 1.40 / 1.30 = 1.077 < 1.08; equal to the best confidence threshold is not above it.
    goals = evaluate_goals(_goal_rows(la=1.40, cf=1.40, ada=1.39), None, False, GOALS)
    assert [m for _, m, _ in goals[:3]] == [False, False, True]


def test_goals_not_measured_are_reported_as_such():
    goals = evaluate_goals([_row("autoregressive", 10.0, 10.0)], None, True, GOALS)
    assert [met for _, met, _ in goals] == [None] * 8
    assert goals[-1] == ("head overhead ≤ 3% of a draft step", None, "not measured (no head loaded)")
    # c = 0.2 not declared: the goals that need it say so; the fitted-cost goal is still judged.
    rows = [replace(r, ratio_speedups={"0.1": r.ratio_speedups["0.1"]}) for r in _goal_rows()]
    goals = evaluate_goals(rows, None, True, GOALS)
    assert [met for _, met, _ in goals[:5]] == [None, True, None, None, None]
    assert goals[0][2] == "not measured (c = 0.2 is not among --cost-ratios)"
    # No AdaEDL or oracle runs; an oracle not above fixed K leaves no gap to capture.
    rows = [r for r in _goal_rows() if not r.method.startswith("adaedl")]
    goals = evaluate_goals(rows, None, True, GOALS)
    assert goals[3][1:] == (None, "not measured (needs specdecpp and adaedl or adaedl-adapt runs)")
    goals = evaluate_goals(_goal_rows(oracle=1.3), None, True, GOALS)
    assert goals[4][1] is None and goals[4][2].startswith("no gap to capture")
    goals = evaluate_goals([r for r in _goal_rows() if r.method != "oracle"], None, True, GOALS)
    assert goals[4][1:] == (None, "not measured (needs specdecpp, specdec and oracle runs)")


def test_hf_custom_goal_compares_the_row_with_its_twin():
    twin = _at("specdec", 1.3, wall=10.0, k=3)
    _, met, detail = overhead_goal([twin, _custom(twin, wall=9.4)], GOALS)
    assert met is False and detail.endswith(": 0.940×")  # the wrapper costs 6%
    assert overhead_goal([twin, _custom(twin, wall=9.6)], GOALS)[1] is True
    other = _at("specdec", 1.3, wall=10.0, k=4)  # not the setting the hf-custom row decoded
    assert overhead_goal([other, _custom(twin, wall=9.6)], GOALS)[1] is None


def test_head_kinds_compared_per_ratio():
    kinds = compare_head_kinds(_goal_rows(), ["0.2", "0.1"])
    assert kinds["columns"] == ["0.2", "0.1", "fitted"]
    cand, look = kinds["heads"]["specdecpp"], kinds["heads"]["specdecpp-lookahead"]
    assert (cand["kind"], look["kind"]) == ("candidate", "lookahead")
    assert look["head"] == "/z/greedy-lookahead/head.safetensors"
    assert cand["best"]["0.2"] == {"params": {"h": 0.3}, "score": 1.40}
    assert look["best"]["fitted"] == {"params": {"h": 0.6}, "score": pytest.approx(15.5)}
    w = kinds["winners"]["0.2"]
    assert (w["kind"], w["family"], w["other_kind"]) == ("lookahead", "specdecpp-lookahead", "candidate")
    assert w["margin"] == pytest.approx(1.55 / 1.40)
    assert kind_lines(kinds)[0] == ("head kinds at c = 0.2: lookahead (specdecpp-lookahead) wins by 1.107×, "
                                     "1.550× vs 1.400× for candidate (specdecpp)")  # fmt: skip
    # Two heads of one kind and none of the other: per-head rows, no winner.
    rows = [r for r in _goal_rows() if r.method != "specdecpp-lookahead"]
    rows.append(_at("specdecpp[other]", 1.6, h=0.4, head="/z/other/head.safetensors"))
    kinds = compare_head_kinds(rows, ["0.2"])
    assert list(kinds["heads"]) == ["specdecpp", "specdecpp[other]"]
    assert kinds["heads"]["specdecpp[other]"]["kind"] == "candidate"
    assert kinds["winners"] == {"0.2": None, "fitted": None} and kind_lines(kinds) == []
    assert compare_head_kinds([_at("specdec", 1.2, k=2)], ["0.2"]) is None


def test_legend_names_head_kinds_and_training_free_rules():
    assert legend_label("specdecpp") == "SpecDec++, candidate head"
    assert legend_label("specdecpp-lookahead[greedy-r1]") == "SpecDec++, lookahead head [greedy-r1]"
    assert legend_label("adaedl-adapt") == "AdaEDL, online λ (training-free)"
    assert legend_label("ucb") == "ucb"


def test_greedy_agreement_share():
    metrics = Metrics(64, 16, 64, 16, 2.0, 0.25, 0.25, 40.0, 32.0)
    measured = [MeasuredRow("autoregressive", {}, "autoregressive", metrics, ("a", "b")),
                MeasuredRow("specdec", {"k": 4}, "specdec:k=4", metrics, ("a", "c"))]  # fmt: skip
    assert [r.matches_autoregressive for r in price_rows(measured, [], greedy=True)] == [1.0, 0.5]
    assert [r.matches_autoregressive for r in price_rows(measured, [], greedy=False)] == [None, None]
    # Without an autoregressive row: no agreement and no speedups over it.
    alone = price_rows(measured[1:], [0.2], greedy=True)[0]
    assert (alone.matches_autoregressive, alone.modeled_speedup, alone.wall_speedup) == (None, None, None)
    assert alone.ratio_speedups == {"0.2": pytest.approx(64 / (0.2 * 64 + 16))}
    # A bench of the fast path alone: its autoregressive@fast row is the reference (it was none, so no
    # fast-only bench checked its outputs).
    fast = [MeasuredRow(f"{m.method}@fast", m.params, m.spec, m.metrics, m.outputs) for m in measured]
    priced = price_rows(fast, [], greedy=True)
    assert [r.matches_autoregressive for r in priced] == [1.0, 0.5] and priced[0].wall_speedup == 1.0


def test_rows_keep_the_keys_of_results_json():
    """results.json's rows are `BenchRow.to_dict()`: these keys in this order (docs and scripts read them)."""
    metrics = Metrics(64, 16, 64, 16, 2.0, 0.25, 0.25, 40.0, 32.0)
    row = price_rows([MeasuredRow("autoregressive", {}, "autoregressive", metrics, ("a",))], [0.2], True)[0]
    data = row.to_dict()
    assert list(data) == ["method", "params", "spec", "tokens", "target_calls", "draft_calls", "discarded",
                          "wall_time", "verification_rate", "discard_rate", "modeled_tokens_per_s",
                          "wall_tokens_per_s", "n_prompts", "matches_autoregressive", "modeled_speedup",
                          "wall_speedup", "ratio_speedups"]  # fmt: skip
    assert (data["n_prompts"], data["matches_autoregressive"], data["modeled_speedup"]) == (1, 1.0, 1.0)
    assert BenchRow.from_dict(json.loads(json.dumps(data)) | {"unknown": 1}) == row


def test_report_escapes_bandit_arms_in_tables():
    row = _row("ucb", 5.0, 5.0, spec="ucb:arms=specdec:k=2|specdec:k=4")
    results = {
        "rows": [row.to_dict()], "config": {"prompts": "p", "n_prompts": 1, "max_new_tokens": 8, "seed": 0,
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
    hf = replace(_row("hf-assisted", 1.0, 8.0, num_assistant_tokens=20, confidence_threshold=0.4,
                      adaptive_threshold=False), matches_autoregressive=1.0)  # fmt: skip
    twin = replace(_row("confidence", 1.0, 8.0, tau=0.4), matches_autoregressive=1.0)
    assert "agree: 40/20/30/10. Same schedule, wall clock: ours 10.0 vs HF 8.0 tokens/s (1.25×)." in (
        hf_cross_check([replace(twin, wall_tokens_per_s=10.0), hf])
    )
    assert "DIFFER" in hf_cross_check([replace(twin, draft_calls=31), hf])
    assert hf_cross_check([replace(twin, params={"tau": 0.5}), hf]) is None
    assert hf_cross_check([twin, replace(hf, matches_autoregressive=None)]) is None  # sampling: no check


def _counted(method: str, tokens: int, target: int, draft: int, **params) -> MeasuredRow:
    """A row as `run_bench` builds it, before `build_results` (counts, rates, modelled numbers)."""
    fit = CostFit(t_draft=1e-3, t_target=4e-3, r2=1.0, n_runs=4)
    discarded = draft + target - tokens
    metrics = Metrics(tokens, target, draft, discarded, float(tokens), target / tokens, discarded / tokens,
                      tokens / fit.predict(draft, target), 1.0)  # fmt: skip
    return MeasuredRow(method, params, method, metrics, ("x",))


def _priced_results(ratios: list[float]) -> dict:
    rows = [
        _counted("autoregressive", 64, 64, 0),
        _counted("specdec", 64, 16, 64, k=4),  # 4 candidates a round
        _counted("specdec", 64, 12, 96, k=8),  # 8 a round: fewer target forwards, more draft forwards
    ]
    args = argparse.Namespace(cost_ratios=ratios, plot_ratio=None, prompts="p", max_new_tokens=64, seed=0,
                              device="cpu", dtype="float32", verifier="token", target="t", draft="d",
                              head="h", goals=GOALS)  # fmt: skip
    fit = CostFit(t_draft=1e-3, t_target=4e-3, r2=1.0, n_runs=4)
    return build_results(args, rows, fit, None, [], SamplingConfig(), 1)


def test_rows_are_priced_at_declared_cost_ratios():
    res = _priced_results([0.2, 0.05, 0.2])  # a repeated ratio is priced once
    assert res["cost_ratios"] == [0.2, 0.05] and res["fitted_ratio"] == pytest.approx(0.25)
    ar, k4, k8 = res["rows"]
    assert ar["ratio_speedups"] == {"0.2": 1.0, "0.05": 1.0}
    assert k4["ratio_speedups"]["0.2"] == pytest.approx(64 / (0.2 * 64 + 16))
    assert k8["ratio_speedups"]["0.05"] == pytest.approx(64 / (0.05 * 96 + 12))
    # Stored as numbers in results.json; the fitted column is unchanged (c = 0.25 here).
    again = json.loads(json.dumps(res))
    assert all(isinstance(v, float) for r in again["rows"] for v in r["ratio_speedups"].values())
    assert k4["modeled_speedup"] == pytest.approx(64 / (0.25 * 64 + 16))
    # A cheap draft favours longer drafts: K = 4 wins at c = 0.2, K = 8 at c = 0.05.
    rows = [BenchRow.from_dict(r) for r in res["rows"]]
    assert best_by_family(rows, "0.2")["specdec"].params == {"k": 4}
    assert best_by_family(rows, "0.05")["specdec"].params == {"k": 8}
    assert _priced_results([])["rows"][1]["ratio_speedups"] == {}


def test_report_has_a_column_per_declared_ratio():
    res = _priced_results([0.2, 0.05])
    res["config"] |= {"target": "t", "draft": "d", "head": "h"}
    text = render_report(res)
    assert "fitted ratio c = t_draft / t_target = 0.250" in text
    assert "| speedup @ c=0.2 | speedup @ c=0.05 |" in text
    lines = text.splitlines()
    best = lines.index("## Best setting of each method at each declared cost ratio")
    table = [line for line in lines[best:] if line.startswith("| specdec")]
    assert table[0] == "| specdec | 2.22× (k=4) | 3.81× (k=8) |"
    # The best-by-fitted-cost table has 8 + 2 columns, the all-settings table 9 + 2 (K = 4 is in both).
    cells = [line.count("|") - 1 for line in lines if line.startswith("| specdec | k=4")]
    assert cells == [10, 11]
    header = next(line for line in lines if line.startswith("| method | setting | N |"))
    assert header.count("|") - 1 == 11


def test_pareto_plot_adds_a_panel_at_a_chosen_ratio(tmp_path):
    import matplotlib.image

    rows = [BenchRow.from_dict(r) for r in _priced_results([0.2])["rows"]]
    plot_pareto(rows, tmp_path / "one.png")
    plot_pareto(rows, tmp_path / "two.png", ratio=0.05)
    one, two = (matplotlib.image.imread(tmp_path / f"{n}.png") for n in ("one", "two"))
    assert one.shape[0] == two.shape[0] and two.shape[1] == 2 * one.shape[1]


def test_pareto_plots_a_fast_only_bench_and_drops_fast_twins_of_eager_rows():
    """A bench run with `--paths fast` alone plots its rows under their eager names (its plot was empty);
    beside eager rows, the fast twins stay out (they count the same)."""
    from dataclasses import replace as with_fields

    from acchead.inference.bench.pareto import _plotted_families

    rows = [BenchRow.from_dict(r) for r in _priced_results([0.2])["rows"]]
    fast = [with_fields(r, method=r.method + "@fast") for r in rows]
    assert set(_plotted_families(fast)) == set(_plotted_families(rows)) != set()
    assert _plotted_families(rows + fast) == _plotted_families(rows)


def test_goal_thresholds_come_from_the_bench_config(tmp_path):
    from acchead.errors import AccheadError
    from acchead.inference.bench.config import build_parser, resolve_args

    assert (GOALS.ratio, GOALS.greedy_over_specdec, GOALS.head_overhead_max) == (0.2, 1.15, 0.03)
    user = tmp_path / "user.yaml"
    user.write_text("goals:\n  greedy_over_specdec: 1.5\n  ratio: 0.1\n")  # the other keys: shipped
    args = resolve_args(build_parser().parse_args(["--config", str(user)]))
    assert args.goals == replace(GOALS, greedy_over_specdec=1.5, ratio=0.1)
    goals = evaluate_goals(_goal_rows(), None, True, args.goals)
    # Judged at c = 0.1 (1.55 + 0.5 vs 1.30 + 0.5: 1.14×), against 1.5×.
    assert goals[0][:2] == ("greedy: best SpecDec++ ≥ 1.50× best fixed K at c = 0.1", False)
    assert goals[2][0] == "greedy: best SpecDec++ ≥ 1.05× best confidence threshold at c = 0.1"
    for text, message in [("  warp: 1\n", "unknown keys warp"), ("  ratio: fast\n", "bad value for ratio")]:
        user.write_text("goals:\n" + text)
        with pytest.raises(AccheadError, match=message):
            resolve_args(build_parser().parse_args(["--config", str(user)]))
    with pytest.raises(AccheadError, match="no value for ratio"):
        GoalThresholds.from_mapping({k: v for k, v in GOALS.to_dict().items() if k != "ratio"})


def test_a_fast_only_bench_prices_its_rows_with_the_fast_fit():
    """`--paths fast` leaves no eager runs: the fast path's fit prices the rows (the check read a present
    None as missing, and such a bench failed after all its runs)."""
    fast = CostFit(t_draft=1e-3, t_target=4e-3, r2=0.9, n_runs=20)
    eager = CostFit(t_draft=2e-3, t_target=7e-3, r2=0.8, n_runs=20)
    assert base_fit({"eager": None, "fast": fast, "hf": None}) is fast
    assert base_fit({"eager": eager, "fast": fast}) is eager
    with pytest.raises(AccheadError, match="the cost fit needs runs"):
        base_fit({"eager": None, "fast": None, "hf": None})
