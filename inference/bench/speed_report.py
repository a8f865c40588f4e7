"""The bench's wall-clock comparison of the ways to run the models: our eager path, our fast path
(static caches + compiled forwards), and Hugging Face's `generate` / assisted generation.

Each path has its own fitted unit costs t_draft, t_target (`acchead.inference.bench.run.path_fits`): on a
GPU the eager path is bound by kernel launches, so its ratio t_draft/t_target is far from what the weights
alone would give, and the fast path is there to close that gap. The goals (issue 11) compare wall-clock
tokens/s measured side by side in this one run (thresholds: `goals:` in configs/bench.yaml):
- CPU: our autoregressive decoding ≥ `cpu_ar_over_generate` × transformers `generate`, our best fixed K ≥
  `cpu_k_over_assisted` × assisted generation (the bench's default is 1 thread);
- GPU: our autoregressive decoding ≤ `gpu_ar_ms_per_token` ms/token, our best fixed K ≥
  `gpu_k_over_assisted` × assisted generation and faster than our own autoregressive decoding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from acchead.inference.bench.hf_assisted import GENERATE_METHOD
from acchead.inference.bench.hf_assisted import METHOD as ASSISTED_METHOD
from acchead.inference.bench.rows import BenchRow
from acchead.inference.bench.settings import fast_family
from acchead.inference.bench.thresholds import GoalThresholds

# Path -> (its autoregressive family, its fixed-K family).
PATH_FAMILIES = {
    "eager": ("autoregressive", "specdec"),
    "fast": (fast_family("autoregressive"), fast_family("specdec")),
    "hf": (GENERATE_METHOD, ASSISTED_METHOD),
}

Goal = tuple[str, bool | None, str]


def _fastest(rows: Sequence[BenchRow], family: str) -> BenchRow | None:
    """The row of `family` with the highest wall-clock tokens/s, or None."""
    rs = [r for r in rows if r.method == family and r.wall_tokens_per_s > 0]
    return max(rs, key=lambda r: r.wall_tokens_per_s) if rs else None


def _ms(r: BenchRow | None) -> float | None:
    return None if r is None else 1e3 / r.wall_tokens_per_s


def speed_by_path(rows: Sequence[BenchRow], path_fits: dict[str, dict]) -> dict[str, dict[str, Any]]:
    """Per path that ran: its fitted costs, its autoregressive ms/token and its fastest fixed-K row."""
    out: dict[str, dict[str, Any]] = {}
    for path, (ar_family, k_family) in PATH_FAMILIES.items():
        ar, k = _fastest(rows, ar_family), _fastest(rows, k_family)
        if ar is None and k is None:
            continue
        out[path] = {
            "fit": path_fits.get(path),
            "ar_ms_per_token": _ms(ar),
            "k_ms_per_token": _ms(k),
            "k_setting": None if k is None else (k.spec or k.method),
            "k_over_ar": None if ar is None or k is None else k.wall_tokens_per_s / ar.wall_tokens_per_s,
        }
    return out


def _best_of(rows: Sequence[BenchRow], families: tuple[str, ...]) -> BenchRow | None:
    found = [r for r in (_fastest(rows, f) for f in families) if r is not None]
    return max(found, key=lambda r: r.wall_tokens_per_s) if found else None


def _ratio_goal(goal: str, ours: BenchRow | None, theirs: BenchRow | None, need: float) -> Goal:
    if ours is None or theirs is None:
        return goal, None, "not measured (needs both rows in this run)"
    ratio = ours.wall_tokens_per_s / theirs.wall_tokens_per_s
    detail = (f"{ratio:.2f}× ({ours.wall_tokens_per_s:.1f} tok/s, {ours.method} {ours.spec}, vs "
              f"{theirs.wall_tokens_per_s:.1f}, {theirs.method})")  # fmt: skip
    return goal, ratio >= need, detail


def speed_goals(rows: Sequence[BenchRow], device: str, t: GoalThresholds) -> list[Goal]:
    """The wall-clock goals of the device type the bench ran on (see the module docstring)."""
    ours_ar = _best_of(rows, (PATH_FAMILIES["eager"][0], PATH_FAMILIES["fast"][0]))
    ours_k = _best_of(rows, (PATH_FAMILIES["eager"][1], PATH_FAMILIES["fast"][1]))
    generate, assisted = _fastest(rows, GENERATE_METHOD), _fastest(rows, ASSISTED_METHOD)
    if str(device).startswith("cuda"):
        ms = _ms(_fastest(rows, PATH_FAMILIES["fast"][0]))
        ar_goal = (
            f"GPU: our autoregressive decoding (fast path) ≤ {t.gpu_ar_ms_per_token:g} ms/token",
            None if ms is None else ms <= t.gpu_ar_ms_per_token,
            "not measured (needs --paths fast)" if ms is None else f"{ms:.3f} ms/token",
        )
        vs_hf = f"GPU: our best fixed K ≥ {t.gpu_k_over_assisted:g}× HF assisted generation's tokens/s"
        vs_ar = "GPU: our best fixed K faster than our autoregressive decoding"
        return [
            ar_goal,
            _ratio_goal(vs_hf, ours_k, assisted, t.gpu_k_over_assisted),
            _ratio_goal(vs_ar, ours_k, ours_ar, 1.0),
        ]
    need = t.cpu_ar_over_generate
    vs_generate = f"CPU: our autoregressive decoding ≥ {need:g}× transformers generate (wall)"
    vs_assisted = f"CPU: our best fixed K ≥ {t.cpu_k_over_assisted:g}× HF assisted generation (wall)"
    return [
        _ratio_goal(vs_generate, ours_ar, generate, t.cpu_ar_over_generate),
        _ratio_goal(vs_assisted, ours_k, assisted, t.cpu_k_over_assisted),
    ]


def render_speed(results: dict) -> list[str]:
    """The report's section on paths; empty when no path comparison ran."""
    paths = results.get("speed_by_path") or {}
    if len(paths) < 2:
        return []

    def f(x: float | None, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    lines = [
        "",
        "## Wall clock by path",
        "",
        "Each way of running the models, with unit costs fitted over its own runs (least squares, no "
        "intercept). eager: our decoders on `DynamicCache`; fast: static caches and forwards compiled once "
        "per shape (`--paths fast`); hf: transformers `generate` (autoregressive) and assisted generation "
        "(fixed-K column). Best fixed K = the fastest row of the K grid on the wall clock.",
        "",
        "| path | t_draft (ms) | t_target (ms) | t_draft/t_target | autoregressive ms/token | "
        "best fixed K ms/token | setting | K over autoregressive |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for path, p in paths.items():
        fit = p["fit"] or {}
        td, tt = fit.get("t_draft"), fit.get("t_target")
        costs = f"{f(td and td * 1e3, '.3f')} | {f(tt and tt * 1e3, '.3f')} | {f(fit.get('ratio'), '.3f')}"
        lines.append(
            f"| {path} | {costs} | {f(p['ar_ms_per_token'], '.3f')} | {f(p['k_ms_per_token'], '.3f')} | "
            f"{p['k_setting'] or '-'} | {f(p['k_over_ar'], '.2f')} |"
        )
    return lines
