"""The bench's Pareto plot `pareto.png`: verification rate vs discard rate, one curve per method family
(the paper's Figure 4; lower-left is better), and optionally the modelled speedup at a declared ratio."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from acchead.inference.bench.costmodel import ratio_speedup
from acchead.inference.bench.hf_assisted import GENERATE_METHOD
from acchead.inference.bench.hf_custom import METHOD as CUSTOM_METHOD
from acchead.inference.bench.rows import BenchRow
from acchead.inference.bench.settings import eager_family, head_kind_of, is_fast
from acchead.rundir import commit

TRAINING_FREE = ("confidence", "entropy", "adaedl", "adaedl-adapt")
_LEGEND = {
    "autoregressive": "autoregressive",
    "specdec": "SpecDec, fixed K",
    "confidence": "confidence rule (training-free)",
    "entropy": "entropy rule (training-free)",
    "adaedl": "AdaEDL, fixed λ (training-free)",
    "adaedl-adapt": "AdaEDL, online λ (training-free)",
    "oracle": "hindsight oracle (bound)",
    "hf-assisted": "HF assisted generation",
}


def legend_label(family: str) -> str:
    """A family's name in the plot's legend: SpecDec++ families by head kind (and head, when suffixed)."""
    kind = head_kind_of(family)
    if kind is not None:
        suffix = family[len(family.split("[", 1)[0]) :]
        return f"SpecDec++, {kind} head{' ' + suffix if suffix else ''}"
    return _LEGEND.get(family, family)


def _style(family: str, i: int, n_points: int) -> dict[str, Any]:
    """Line style of a family: SpecDec++ heads bold solid (lookahead diamonds, candidate circles), the
    training-free rules dashed with triangles, a single-point family as a large marker; colours from tab20
    (its 10 dark shades first), so up to 20 families stay distinct."""
    import matplotlib.pyplot as plt

    color = plt.get_cmap("tab20")((2 * i) % 20 + (i // 10) % 2)
    kind = head_kind_of(family)
    style: dict[str, Any] = {"color": color, "marker": "o", "ms": 4, "lw": 1.2, "ls": "-"}
    if kind is not None:
        style |= {"marker": "D" if kind == "lookahead" else "o", "ms": 5, "lw": 2.2}
    elif family in TRAINING_FREE:
        style |= {"marker": "v", "ls": "--"}
    elif family == "oracle":
        style |= {"marker": "*"}
    elif family in ("autoregressive", "hf-assisted"):
        style |= {"marker": "s"}
    if n_points == 1:
        style |= {"ms": 9, "ls": "none"}
    return style


def _plotted_families(rows: Sequence[BenchRow]) -> dict[str, list[BenchRow]]:
    """Rows by family, without the rows that count exactly what a plotted twin counts: plain `generate`
    and our loop inside `generate` (their autoregressive / direct twins), and fast-path rows whose eager
    twins ran; a family run on the fast path alone (`--paths fast`) is plotted under its eager name."""
    eager = {r.method for r in rows if not is_fast(r.method)}
    fam: dict[str, list[BenchRow]] = defaultdict(list)
    for r in rows:
        base = eager_family(r.method)
        if r.method not in (GENERATE_METHOD, CUSTOM_METHOD) and (r.method == base or base not in eager):
            fam[base].append(r)
    return fam


def plot_pareto(rows: Sequence[BenchRow], path: Path, ratio: float | None = None) -> None:
    """Verification rate vs discard rate, one curve per family (paper's Figure 4; lower-left is better).

    Each SpecDec++ head (candidate, lookahead) is its own family, hence its own curve, drawn bold; the
    training-free rules (confidence, entropy, AdaEDL) dashed. With `ratio` (a declared
    c = t_draft / t_target), a second panel plots each row's modelled speedup over autoregressive decoding
    at c, N / (c·N_draft + N_target), against the same discard rate.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fam = _plotted_families(rows)

    def draw(ax: Any, y_of: Callable[[BenchRow], float], ylabel: str, title: str) -> None:
        for i, (name, rs) in enumerate(fam.items()):
            rs = sorted(rs, key=lambda r: r.discard_rate)
            xs, ys = [r.discard_rate for r in rs], [y_of(r) for r in rs]
            ax.plot(xs, ys, label=legend_label(name), **_style(name, i, len(rs)))
        ax.set_xlabel("discard rate  N_discarded / N")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2 if len(fam) > 8 else 1)

    fig, axes = plt.subplots(1, 1 if ratio is None else 2, figsize=(6.4 if ratio is None else 12.8, 4.8),
                             squeeze=False)  # fmt: skip
    draw(axes[0][0], lambda r: r.verification_rate, "verification rate  N_target / N",
         "Speculative decoding: cost per generated token (lower-left is better)")  # fmt: skip
    if ratio is not None:
        axes[0][1].axhline(1.0, color="grey", lw=0.8, ls="--")  # autoregressive
        draw(axes[0][1], lambda r: ratio_speedup(r.tokens, r.draft_calls, r.target_calls, ratio),
             f"modelled speedup  N / (c·N_draft + N_target), c = {ratio:g}",
             f"Speedup over autoregressive at t_draft / t_target = {ratio:g} (higher is better)")  # fmt: skip
    fig.tight_layout()
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    commit(tmp, path)  # fsync, rename, fsync the directory
