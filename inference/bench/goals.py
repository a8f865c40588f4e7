"""The bench's goals (issue 10), judged from the rows against the thresholds of the bench config.

The goals compare "best SpecDec++" — the best row over every SpecDec++ family, i.e. over both head kinds —
with the best row of each baseline family, at the declared ratio c = `GoalThresholds.ratio` and at the
fitted costs; they are computed from the rows, never hard-coded. A goal is (goal, met, detail), met None
when it could not be measured in this run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from acchead.inference.bench.head_timing import HeadOverhead
from acchead.inference.bench.hf_custom import METHOD as CUSTOM_METHOD
from acchead.inference.bench.rows import BenchRow, who
from acchead.inference.bench.settings import eager_family, is_fast, is_specdecpp
from acchead.inference.bench.thresholds import GoalThresholds

Goal = tuple[str, bool | None, str]
Score = Callable[[BenchRow], float]
ADAEDL_FAMILIES = ("adaedl", "adaedl-adapt")


def fitted(r: BenchRow) -> float:
    """A row's score at the fitted costs: modelled tokens/s."""
    return r.modeled_tokens_per_s


def at_ratio(key: str) -> Score:
    """A row's score at the declared ratio `key`: its modelled speedup over autoregressive there."""
    return lambda r: r.ratio_speedups[key]


def best_row(rows: Sequence[BenchRow], keep: Callable[[str], bool], score: Score) -> BenchRow | None:
    """The highest-scoring row among the families `keep` accepts (the first of ties), or None."""
    best = None
    for r in rows:
        if keep(r.method) and (best is None or score(r) > score(best)):
            best = r
    return best


def best_by_family(rows: Sequence[BenchRow], ratio: str | None = None) -> dict[str, BenchRow]:
    """The row with the highest modelled throughput in each method family, in first-seen order.

    `ratio` (a key of the rows' `ratio_speedups`, e.g. "0.2") ranks by the speedup at that declared cost
    ratio instead of the fitted costs.
    """
    score = fitted if ratio is None else at_ratio(ratio)
    best: dict[str, BenchRow] = {}
    for r in rows:
        if r.method not in best or score(r) > score(best[r.method]):
            best[r.method] = r
    return best


def _compare(goal: str, pp: BenchRow | None, other: BenchRow | None, score: Score | None,
             factor: float | None, needs: str, unit: str, ratio: float) -> Goal:  # fmt: skip
    """`pp` ≥ factor × `other` by `score` (`factor` None: strictly above); `score` None: c not declared."""
    if score is None:
        return goal, None, f"not measured (c = {ratio:g} is not among --cost-ratios)"
    if pp is None or other is None:
        return goal, None, f"not measured (needs {needs} runs)"
    a, b = score(pp), score(other)
    quotient = a / b if b > 0 else float("inf")
    met = a > b if factor is None else quotient >= factor
    return goal, met, f"{a:.3f}{unit} ({who(pp)}) vs {b:.3f}{unit} ({who(other)}): {quotient:.3f}×"


def _oracle_gap(goal: str, pp: BenchRow | None, sd: BenchRow | None, oracle: BenchRow | None,
                score: Score | None, t: GoalThresholds) -> Goal:  # fmt: skip
    """(pp − K) / (oracle − K) in speedup ≥ t.greedy_oracle_gap; None when unmeasured or there is no gap."""
    if score is None:
        return goal, None, f"not measured (c = {t.ratio:g} is not among --cost-ratios)"
    if pp is None or sd is None or oracle is None:
        return goal, None, "not measured (needs specdecpp, specdec and oracle runs)"
    a, k, o = score(pp), score(sd), score(oracle)
    speeds = f"SpecDec++ {a:.3f}×, fixed K {k:.3f}×, oracle {o:.3f}×"
    if o <= k:
        return goal, None, f"no gap to capture: {speeds}"
    share = (a - k) / (o - k)
    return goal, share >= t.greedy_oracle_gap, f"{share:.1%} of the gap ({speeds}; {who(pp)}, {who(sd)})"


def _hf_goal(rows: Sequence[BenchRow]) -> Goal:
    """Our fastest fixed-K SpecDec (wall clock) vs Hugging Face assisted generation."""
    hf = next((r for r in rows if r.method == "hf-assisted"), None)
    sd = [r for r in rows if r.method == "specdec"]
    goal = "our best fixed-K SpecDec wall-clock tokens/s ≥ Hugging Face assisted generation's"
    if not (sd and hf):
        return goal, None, "not measured (needs specdec and hf-assisted runs)"
    fastest = max(sd, key=lambda r: r.wall_tokens_per_s)
    met = fastest.wall_tokens_per_s >= hf.wall_tokens_per_s
    ratio = fastest.wall_tokens_per_s / hf.wall_tokens_per_s if hf.wall_tokens_per_s else 0.0
    detail = (f"{fastest.wall_tokens_per_s:.2f} ({fastest.spec}) vs {hf.wall_tokens_per_s:.2f} tokens/s "
              f"({ratio:.3f}×)")  # fmt: skip
    return goal, met, detail


def twin_row(rows: Sequence[BenchRow], row: BenchRow) -> BenchRow | None:
    """The bench row an `hf-custom` row decoded the same setting as (`config.hf_custom_setting`)."""
    params = {k: v for k, v in row.params.items() if k != "twin"}
    family = row.params.get("twin")
    return next((r for r in rows if r.method == family and r.spec == row.spec and r.params == params), None)


def overhead_goal(rows: Sequence[BenchRow], t: GoalThresholds) -> Goal:
    """The `hf-custom` row's wall-clock tokens/s ≥ t.generate_wrapper_min × its twin's."""
    goal = (f"our decoder through transformers' generate keeps ≥ {t.generate_wrapper_min:.2f}× of its direct "
            "wall-clock tokens/s")  # fmt: skip
    row = next((r for r in rows if r.method == CUSTOM_METHOD), None)
    twin = twin_row(rows, row) if row is not None else None
    if row is None or twin is None or twin.wall_tokens_per_s <= 0:
        needs = f"needs the {CUSTOM_METHOD} row and the row of the setting it decodes"
        return goal, None, f"not measured ({needs})"
    ratio = row.wall_tokens_per_s / twin.wall_tokens_per_s
    detail = (f"{row.wall_tokens_per_s:.2f} vs {twin.wall_tokens_per_s:.2f} tokens/s "
              f"({twin.method} {row.spec}): {ratio:.3f}×")  # fmt: skip
    return goal, ratio >= t.generate_wrapper_min, detail


def _head_overhead_goals(overhead: dict[str, HeadOverhead] | None, t: GoalThresholds) -> list[Goal]:
    """Each head's call ≤ t.head_overhead_max of a draft step (by family)."""
    goal = f"head overhead ≤ {t.head_overhead_max:.0%} of a draft step"
    if not overhead:
        return [(goal, None, "not measured (no head loaded)")]
    return [
        (f"{goal} ({fam})", o.ratio <= t.head_overhead_max,
         f"{o.ratio:.2%} ({o.head_s * 1e6:.0f} µs head vs {o.draft_step_s * 1e6:.0f} µs draft step, "
         f"medians of {o.calls})")
        for fam, o in overhead.items()
    ]  # fmt: skip


def evaluate_goals(rows: Sequence[BenchRow], overhead: dict[str, HeadOverhead] | None, greedy: bool,
                   t: GoalThresholds) -> list[Goal]:  # fmt: skip
    """The issue's goals as (goal, met or None when not measurable, detail), judged from the rows.

    "Best SpecDec++" is the best row over every SpecDec++ family (both head kinds); "best fixed K" the best
    `specdec` row; "best AdaEDL" the best `adaedl` or `adaedl-adapt` row. Ratio goals rank by the rows'
    speedup at c = `t.ratio`; "not measured" if that ratio was not declared. Greedy: best SpecDec++ ≥
    `greedy_over_specdec` × best fixed K at c and at the fitted costs (modelled tokens/s), ≥
    `greedy_over_rules` × the best confidence threshold and the best AdaEDL setting at c, and ≥
    `greedy_oracle_gap` of the fixed-K-to-oracle gap (pp − K) / (oracle − K) at c. Sampling: ≥
    `sampling_over_specdec` × best fixed K and above the best confidence and AdaEDL settings at c. Then our
    fixed K vs HF assisted generation (wall clock), our decoder through `generate` (hf-custom) vs the same
    setting called directly, and the head overhead of each head in `overhead` (by family).
    """
    every = rows
    rows = counted_rows(rows)
    key = t.ratio_key
    at = at_ratio(key) if rows and all(key in r.ratio_speedups for r in rows) else None
    c = f"c = {key}"

    def family(*names: str) -> Callable[[str], bool]:
        return lambda m: eager_family(m) in names

    def is_pp(m: str) -> bool:
        return is_specdecpp(eager_family(m))

    def pick(keep: Callable[[str], bool], score: Score | None) -> BenchRow | None:
        return best_row(rows, keep, score) if score is not None else None

    def compare(goal: str, pp: BenchRow | None, other: BenchRow | None, score: Score | None,
                factor: float | None, needs: str, unit: str = "×") -> Goal:  # fmt: skip
        return _compare(goal, pp, other, score, factor, needs, unit, t.ratio)

    pp_at, pp_fit = pick(is_pp, at), best_row(rows, is_pp, fitted)
    sd_at, sd_fit = pick(family("specdec"), at), best_row(rows, family("specdec"), fitted)
    cf_at, ada_at = pick(family("confidence"), at), pick(family(*ADAEDL_FAMILIES), at)
    ada_needs = "specdecpp and adaedl or adaedl-adapt"
    goals: list[Goal] = []
    if greedy:
        over_k, over_rules = t.greedy_over_specdec, t.greedy_over_rules
        goals += [
            compare(f"greedy: best SpecDec++ ≥ {over_k:.2f}× best fixed K at {c}", pp_at, sd_at, at, over_k,
                    "specdecpp and specdec"),
            compare(f"greedy: best SpecDec++ ≥ {over_k:.2f}× best fixed K at the fitted costs", pp_fit,
                    sd_fit, fitted, over_k, "specdecpp and specdec", " tok/s"),
            compare(f"greedy: best SpecDec++ ≥ {over_rules:.2f}× best confidence threshold at {c}", pp_at,
                    cf_at, at, over_rules, "specdecpp and confidence"),
            compare(f"greedy: best SpecDec++ ≥ {over_rules:.2f}× best AdaEDL setting at {c}", pp_at, ada_at,
                    at, over_rules, ada_needs),
        ]  # fmt: skip
        goal = f"greedy: best SpecDec++ captures ≥ {t.greedy_oracle_gap:.0%} of the fixed-K-to-oracle gap"
        goals.append(_oracle_gap(f"{goal} at {c}", pp_at, sd_at, pick(family("oracle"), at), at, t))
    else:
        over_k = t.sampling_over_specdec
        goals += [
            compare(f"sampling: best SpecDec++ ≥ {over_k:.2f}× best fixed K at {c}", pp_at, sd_at, at, over_k,
                    "specdecpp and specdec"),
            compare(f"sampling: best SpecDec++ above the best confidence threshold at {c}", pp_at, cf_at, at,
                    None, "specdecpp and confidence"),
            compare(f"sampling: best SpecDec++ above the best AdaEDL setting at {c}", pp_at, ada_at, at, None,
                    ada_needs),
        ]  # fmt: skip
    return [*goals, _hf_goal(every), overhead_goal(every, t), *_head_overhead_goals(overhead, t)]


def counted_rows(rows: Sequence[BenchRow]) -> list[BenchRow]:
    """The rows the counted goals read: each family's eager rows, or its fast-path rows (NAME@fast) where the
    run has no eager ones (`--paths fast`). A fast row decodes as its eager twin, so both have the same
    counts; keeping one path's rows per family keeps a setting from being judged twice."""
    eager = {r.method for r in rows if not is_fast(r.method)}
    return [r for r in rows if not is_fast(r.method) or eager_family(r.method) not in eager]
