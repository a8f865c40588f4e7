"""The bench's outputs: `results.json`, the Pareto plot `pareto.png`, and `report.md` with the goals.

Rows are per method and setting (`acchead.inference.bench.rows.BenchRow`); "best" means highest modelled
throughput (eq. 2.3 with the fitted unit costs), since modelled numbers are what the paper compares and
they do not depend on scheduler noise. Every row is also priced at declared cost ratios
c = t_draft / t_target (`--cost-ratios`): its speedup over autoregressive decoding N / (c·N_draft +
N_target), stored as numbers in `ratio_speedups` and shown as a column per ratio, because unit costs fitted
on a CPU do not transfer to a GPU. The goals (`goals.py`) are judged against the thresholds of the bench
config (`goals:` in configs/bench.yaml); the head kinds are compared in `head_kinds.py`; the plot is drawn
by `pareto.py`. `report.md` is rendered from the `results.json` object alone, one function per section.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from acchead.inference.bench.costmodel import CostFit
from acchead.inference.bench.goals import best_by_family, evaluate_goals
from acchead.inference.bench.head_kinds import compare_head_kinds, kind_lines, render_head_kinds
from acchead.inference.bench.head_timing import HeadOverhead
from acchead.inference.bench.pareto import plot_pareto
from acchead.inference.bench.rows import BenchRow, MeasuredRow, fmt_params, price_rows, ratio_keys
from acchead.inference.bench.settings import FIT_FAMILIES
from acchead.inference.bench.speed_report import render_speed, speed_by_path, speed_goals
from acchead.rundir import atomic_write_text
from acchead.sampling import SamplingConfig


def hf_cross_check(rows: Sequence[BenchRow]) -> str | None:
    """Under greedy decoding transformers' default schedule (stop below confidence tau, at most 20 tokens)
    is our `confidence:tau=<tau>` policy, so both must count the same forwards; a note saying whether
    they do validates the hook-based counting of the HF run."""
    hf = next((r for r in rows if r.method == "hf-assisted"), None)
    if hf is None or hf.matches_autoregressive is None:  # None: not greedy, or no AR reference
        return None
    if hf.params.get("adaptive_threshold"):  # scikit-learn re-fits the threshold online: no twin
        return None
    tau = hf.params.get("confidence_threshold")
    twin = next((r for r in rows if r.method == "confidence" and r.params.get("tau") == tau), None)
    if twin is None or hf.params.get("num_assistant_tokens") != 20:
        return None

    def counts(r: BenchRow) -> tuple[int, int, int, int]:
        return r.tokens, r.target_calls, r.draft_calls, r.discarded

    same = counts(hf) == counts(twin)
    wall = twin.wall_tokens_per_s, hf.wall_tokens_per_s
    return (
        f"HF assisted generation's default schedule equals confidence:tau={tau:g},max=20 under greedy "
        f"decoding; counts (N/N_target/N_draft/N_discarded) {'agree' if same else 'DIFFER'}: "
        + "/".join(map(str, counts(hf)))
        + ("" if same else " vs " + "/".join(map(str, counts(twin))))
        + f". Same schedule, wall clock: ours {wall[0]:.1f} vs HF {wall[1]:.1f} tokens/s"
        + (f" ({wall[0] / wall[1]:.2f}×)." if wall[1] > 0 else ".")
    )


def build_results(
    args: argparse.Namespace,
    measured: Sequence[MeasuredRow],
    fit: CostFit,
    overhead: dict[str, HeadOverhead] | None,
    notes: list[str],
    sampling: SamplingConfig,
    n_prompts: int,
    path_fits: dict[str, CostFit | None] | None = None,
) -> dict[str, Any]:
    """The `results.json` object; `summary` holds the goal lines also printed by the CLI.

    The rows are priced (`rows.price_rows`) at `args.cost_ratios` and judged against `args.goals` (the
    config's `GoalThresholds`). `overhead` is the head-overhead measurement of each head, by family (None:
    no head ran); results.json keeps it as `head_overhead = {family: {head_s, draft_step_s, ratio, calls,
    context}}`. `path_fits`: the unit costs fitted per way of running the models (`run.path_fits`), for the
    wall-clock section.
    """
    ratios = list(ratio_keys(args.cost_ratios or []).values())
    rows = price_rows(measured, ratios, sampling.greedy)
    goals = evaluate_goals(rows, overhead, sampling.greedy, args.goals)
    goals += speed_goals(rows, args.device, args.goals)
    fits = {k: f.to_dict() | {"ratio": f.t_draft / f.t_target if f.t_target > 0 else None}
            for k, f in (path_fits or {}).items() if f is not None}  # fmt: skip
    kinds = compare_head_kinds(rows, list(ratio_keys(ratios)))
    check = hf_cross_check(rows)
    notes = [*notes, check] if check else notes
    summary = [f"[{'met' if m else 'NOT met' if m is False else 'n/a'}] {g}: {d}" for g, m, d in goals]
    summary += kind_lines(kinds)
    config = {k: v for k, v in vars(args).items() if k not in ("config", "goals")}
    return {
        "config": config | {"n_prompts": n_prompts, "goals": args.goals.to_dict()},
        "sampling": sampling.to_dict(),
        "t_draft": fit.t_draft,
        "t_target": fit.t_target,
        "r2": fit.r2,
        "fit": fit.to_dict() | {"families": list(FIT_FAMILIES)},
        "fitted_ratio": fit.t_draft / fit.t_target if fit.t_target > 0 else None,
        "cost_ratios": ratios,
        "head_overhead": {fam: o.to_dict() for fam, o in overhead.items()} if overhead else None,
        "head_kinds": kinds,
        "path_fits": fits,
        "speed_by_path": speed_by_path(rows, fits),
        "rows": [r.to_dict() for r in rows],
        "goals": [{"goal": g, "met": m, "detail": d} for g, m, d in goals],
        "notes": notes,
        "summary": summary,
    }


def _speedup(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}×"


def _ratio_cells(r: BenchRow, keys: Sequence[str]) -> str:
    """A row's cells of the declared-ratio columns."""
    return "".join(f" | {_speedup(r.speedup_at(k))}" for k in keys)


def _render_header(results: dict[str, Any], keys: Sequence[str]) -> list[str]:
    """Title; prompts, sampling and models; the cost fit; what the declared-ratio columns mean."""
    cfg = results["config"]
    fitted = results.get("fitted_ratio")
    fitted_text = "" if fitted is None else f"; fitted ratio c = t_draft / t_target = {fitted:.3f}"
    heads = cfg["head"] if isinstance(cfg["head"], list) else [cfg["head"]]
    lines = [
        "# acchead-bench report",
        "",
        f"Prompts: `{cfg['prompts']}` ({cfg['n_prompts']}), max {cfg['max_new_tokens']} new tokens, sampling "
        f"{SamplingConfig.from_dict(results['sampling'])}, seed {cfg['seed']}, device {cfg['device']} "
        f"({cfg['dtype']}), verifier {cfg['verifier']}.",
        f"Target `{cfg['target']}`, draft `{cfg['draft']}`, head{'s' if len(heads) > 1 else ''} "
        + ", ".join(f"`{h}`" for h in heads)
        + ".",
        "",
        f"Cost fit over per-prompt wall times (least squares, no intercept): t_draft = "
        f"{results['t_draft'] * 1e3:.3f} ms, t_target = {results['t_target'] * 1e3:.3f} ms, "
        f"R² = {results['r2']:.3f} ({results['fit']['n_runs']} runs){fitted_text}.",
    ]
    if keys:
        lines += [
            "",
            "Declared cost ratios c = t_draft / t_target (columns `speedup @ c=…`): each row is also "
            "priced at c·N_draft + N_target target-forward units, so its speedup over autoregressive "
            "is N / (c·N_draft + N_target). A CPU fit does not transfer to GPUs, where verifying L "
            "tokens costs about as much as verifying one; 0.2 is the SpecDec++ paper's 7B/70B pair on "
            "an A100, 0.05 a small distilled draft on a GPU.",
        ]
    return lines


def _render_goals(results: dict[str, Any]) -> list[str]:
    """Each goal with its verdict (met, NOT met, n/a) and detail."""
    lines = ["", "## Goals", ""]
    for g in results["goals"]:
        verdict = "met" if g["met"] else "NOT met" if g["met"] is False else "n/a"
        lines.append(f"- **{verdict}** — {g['goal']}: {g['detail']}")
    return lines


def _render_best(rows: Sequence[BenchRow], keys: Sequence[str]) -> list[str]:
    """Each method's best setting by modelled throughput at the fitted costs."""
    at = "".join(f" | speedup @ c={k}" for k in keys)
    lines = [
        "",
        "## Best setting of each method (by modelled throughput)",
        "",
        f"| method | setting | verification rate | discard rate | modelled tok/s | modelled speedup{at} | "
        "wall tok/s | wall speedup |",
        f"|---|---|---|---|---|---{'|---' * len(keys)}|---|---|",
    ]
    for r in best_by_family(rows).values():
        lines.append(
            f"| {r.method} | {fmt_params(r.params)} | {r.verification_rate:.3f} | {r.discard_rate:.3f} | "
            f"{r.modeled_tokens_per_s:.1f} | {_speedup(r.modeled_speedup)}{_ratio_cells(r, keys)} | "
            f"{r.wall_tokens_per_s:.1f} | {_speedup(r.wall_speedup)} |"
        )
    return lines


def _render_best_at_ratios(rows: Sequence[BenchRow], keys: Sequence[str]) -> list[str]:
    """Each method's best setting at each declared ratio (none declared: no section)."""
    if not keys:
        return []
    best_at = {k: best_by_family(rows, k) for k in keys}
    lines = [
        "",
        "## Best setting of each method at each declared cost ratio",
        "",
        "Modelled speedup over autoregressive, N / (c·N_draft + N_target), of each method's best "
        "setting at each c.",
        "",
        "| method" + "".join(f" | c = {k}" for k in keys) + " |",
        "|---" + "|---" * len(keys) + "|",
    ]
    for method in best_by_family(rows):
        cells = ""
        for k in keys:
            b = best_at[k][method]
            cells += f" | {_speedup(b.speedup_at(k))} ({fmt_params(b.params)})"
        lines.append(f"| {method}{cells} |")
    return lines


def _render_all_settings(rows: Sequence[BenchRow], keys: Sequence[str]) -> list[str]:
    """The plot, then every setting's counts, throughputs and greedy agreement with autoregressive."""
    at = "".join(f" | speedup @ c={k}" for k in keys)
    lines = [
        "",
        "![Pareto plot](pareto.png)",
        "",
        "## All settings",
        "",
        f"| method | setting | N | N_target | N_draft | N_discarded | modelled tok/s{at} | wall tok/s | "
        "greedy = AR |",
        f"|---|---|---|---|---|---|---{'|---' * len(keys)}|---|---|",
    ]
    for r in rows:
        agree = "-" if r.matches_autoregressive is None else f"{r.matches_autoregressive:.0%}"
        lines.append(
            f"| {r.method} | {fmt_params(r.params)} | {r.tokens} | {r.target_calls} | {r.draft_calls} | "
            f"{r.discarded} | {r.modeled_tokens_per_s:.1f}{_ratio_cells(r, keys)} | "
            f"{r.wall_tokens_per_s:.1f} | {agree} |"
        )
    return lines


def _render_loop_profile(results: dict[str, Any]) -> list[str]:
    """The decoding loop's profile (`loop_profile.py`); no section when it did not run."""
    if not results.get("loop_profile"):
        return []
    from acchead.inference.bench.loop_profile import profile_table

    return [
        "",
        "## Decoding loop",
        "",
        "Median draft step (a round's drafting over its draft forwards) and verification (the target's "
        "forward through both rollbacks) inside the decoder, beside a bare replay of the same forward "
        "(verification: of the token count the decoder fed most often), and device-to-host reads per "
        "round (`acchead.inference.host_reads`).",
        "",
        profile_table(results["loop_profile"]),
    ]


def _render_notes(results: dict[str, Any]) -> list[str]:
    notes = list(results["notes"])
    if results.get("warm_up_s") is not None:
        notes.append(f"fast path: every decoder's units compiled in {results['warm_up_s']:.1f} s before the "
                     "first timed run (`warm_up`)")  # fmt: skip
    return ["", "## Notes", "", *[f"- {n}" for n in notes]] if notes else []


def render_report(results: dict[str, Any]) -> str:
    """`report.md` from the `results.json` object: header, goals, best settings (at the fitted costs and
    at each declared ratio), head kinds, plot and all settings, wall clock by path, loop profile, notes."""
    rows = [BenchRow.from_dict(r) for r in results["rows"]]
    keys = list(ratio_keys(results.get("cost_ratios") or []))
    lines = [
        *_render_header(results, keys),
        *_render_goals(results),
        *_render_best(rows, keys),
        *_render_best_at_ratios(rows, keys),
        *render_head_kinds(results.get("head_kinds")),
        *_render_all_settings(rows, keys),
        *render_speed(results),
        *_render_loop_profile(results),
        *_render_notes(results),
    ]
    return "\n".join(lines) + "\n"


def write_outputs(results: dict[str, Any], out: Path) -> None:
    """Write results.json, pareto.png and report.md into `out` (each atomically)."""
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "results.json", json.dumps(results, indent=1, default=str))  # fsync + rename
    rows = [BenchRow.from_dict(r) for r in results["rows"]]
    plot_pareto(rows, out / "pareto.png", results["config"].get("plot_ratio"))
    atomic_write_text(out / "report.md", render_report(results))
