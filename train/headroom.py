"""`acchead-headroom`: what a stop rule can buy on gen-data labels, priced in counts, without decoding.

    acchead-headroom --data DIR --head FILE            # the head on its validation prompts
    acchead-headroom --data DIR --aurocs 0.8,0.9,0.95  # calibrated synthetic heads of those AUROCs

gen-data with `--mix-ratio 1` (a lookahead head's data, the default) follows the target's own response and
labels, at each position, whether the draft's candidate there is accepted (greedy: 0 or 1; sampling: the
realised Bernoulli draw of `min(1, p/q)` that training also uses). This replays decoding rounds along that
response: a round starting at position t drafts candidates t, t+1, ... until its rule stops, the target
accepts the leading run of accepted labels and adds one token of its own. It prices the counts as the bench
does, N / (c·N_draft + N_target) over autoregressive decoding, for every fixed K, SpecDec++'s threshold rule
(stop once the product of the head's accept probabilities falls below 1 - h; the candidate that crossed is
verified, as a lookahead head's decoder does) and the hindsight oracle (drafts exactly the accepted run).

An approximation, and an optimistic one for every rule alike: a round's j-th candidate is judged by the
label of the first candidate at that position, whose draft saw the target's prefix, where a decoder's draft
sees its own candidates (and a feature draft its own guessed states). It answers, in a second, how far a
head's AUROC leaves SpecDec++ from the best K and the oracle on a pair's labels, and how good a head would
have to be for a goal (docs/real-pair.md, "What a head can buy").
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from acchead.errors import AccheadError, cli_errors
from acchead.sampling import SamplingConfig
from acchead.train.data import GenData, load_gen_data, read_gen_config, split_by_prompt

Rule = Callable[[np.ndarray, np.ndarray, int], int]  # (accept (n,), p (n,), t) -> candidates to draft at t


@dataclass(frozen=True)
class Counts:
    """What a rule spent over a set of responses: tokens N, draft forwards and target forwards."""

    tokens: int
    drafted: int
    target_calls: int

    def speedup(self, c: float) -> float:
        """Over autoregressive decoding (N target calls) at draft/target cost ratio c."""
        return self.tokens / (c * self.drafted + self.target_calls)


def replay(rule: Rule, accept: Sequence[np.ndarray], probs: Sequence[np.ndarray]) -> Counts:
    """Rounds of `rule` along each response: accept[r] (n_r,) bool, probs[r] (n_r,) the head's P(accept)."""
    tokens = drafted = calls = 0
    for acc, p in zip(accept, probs, strict=True):
        n, t = len(acc), 0
        while t < n:
            d = rule(acc, p, t)
            run = 0
            while run < d and acc[t + run]:
                run += 1
            step = min(run + 1, n - t)  # the accepted run plus the target's own token, within the response
            tokens, drafted, calls, t = tokens + step, drafted + d, calls + 1, t + step
    return Counts(tokens, drafted, calls)


def fixed_k(k: int) -> Rule:
    return lambda acc, p, t: min(k, len(acc) - t)


def threshold(h: float, max_draft: int) -> Rule:
    """SpecDec++: draft until 1 - Π_j p_j > h (that candidate included) or `max_draft` candidates."""
    log_keep = math.log1p(-h)

    def rule(acc: np.ndarray, p: np.ndarray, t: int) -> int:
        log_p, d = 0.0, 0
        while d < max_draft and t + d < len(acc):
            log_p += math.log(max(float(p[t + d]), 1e-300))
            d += 1
            if log_p < log_keep:
                break
        return d

    return rule


def oracle(acc: np.ndarray, p: np.ndarray, t: int) -> int:
    """Hindsight: draft exactly the candidates that will be accepted."""
    d = 0
    while t + d < len(acc) and acc[t + d]:
        d += 1
    return d


def synthetic_probs(accept: np.ndarray, auroc: float, rng: np.random.Generator) -> np.ndarray:
    """(N,) calibrated P(accept) of a binormal head of the given AUROC: score s = ±β + N(0, 1) (+ for an
    accepted candidate), AUROC = Φ(β·√2), P = π·φ(s - β) / (π·φ(s - β) + (1 - π)·φ(s + β))."""
    if not 0.5 <= auroc < 1.0:
        raise AccheadError(f"--aurocs values must be in [0.5, 1), got {auroc:g}")
    from statistics import NormalDist

    beta = NormalDist().inv_cdf(auroc) / math.sqrt(2.0)
    s = np.where(accept, beta, -beta) + rng.standard_normal(len(accept))
    pi = float(np.mean(accept))
    # the ratio φ(s + β) / φ(s - β) = exp(-2βs), written so that it never divides by an underflowed density
    return pi / (pi + (1.0 - pi) * np.exp(-2.0 * beta * s))


def auroc_of(accept: np.ndarray, probs: np.ndarray) -> float:
    """AUROC of `probs` for `accept` (torchmetrics', as training reports it); NaN when a class is empty."""
    if accept.all() or not accept.any():
        return float("nan")
    import torch
    from torchmetrics.functional.classification import binary_auroc

    scores, targets = torch.from_numpy(probs.astype(np.float64)), torch.from_numpy(accept.astype(np.int64))
    return float(binary_auroc(scores, targets))


@dataclass(frozen=True)
class Headroom:
    """One head's (or synthetic head's) row: its AUROC and the counts' speedups at cost ratio c."""

    name: str
    auroc: float
    best_k: int
    best_k_speedup: float
    best_h: float
    specdecpp_speedup: float
    oracle_speedup: float

    @property
    def over_best_k(self) -> float:
        return self.specdecpp_speedup / self.best_k_speedup

    @property
    def share_of_gap(self) -> float:
        """How far SpecDec++ went from the best K to the oracle (0: the best K, 1: the oracle)."""
        gap = self.oracle_speedup - self.best_k_speedup
        return (self.specdecpp_speedup - self.best_k_speedup) / gap if gap > 0 else float("nan")


def headroom(name: str, accept: Sequence[np.ndarray], probs: Sequence[np.ndarray], c: float,
             k_grid: Sequence[int], h_grid: Sequence[float], max_draft: int) -> Headroom:  # fmt: skip
    ks = {k: replay(fixed_k(k), accept, probs).speedup(c) for k in k_grid}
    hs = {h: replay(threshold(h, max_draft), accept, probs).speedup(c) for h in h_grid}
    best_k, best_h = max(ks, key=ks.__getitem__), max(hs, key=hs.__getitem__)
    flat_acc, flat_p = np.concatenate(list(accept)), np.concatenate(list(probs))
    return Headroom(name, auroc_of(flat_acc, flat_p), best_k, ks[best_k], best_h, hs[best_h],
                    replay(oracle, accept, probs).speedup(c))  # fmt: skip


def render(rows: Sequence[Headroom], c: float) -> str:
    """Markdown: one row per head."""
    lines = [
        f"| head | AUROC | best fixed K (c = {c:g}) | SpecDec++ (best h) | × best K | of the way | oracle |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r.name} | {r.auroc:.3f} | {r.best_k_speedup:.3f}× (K = {r.best_k}) | "
                     f"{r.specdecpp_speedup:.3f}× (h = {r.best_h:g}) | {r.over_best_k:.3f}× | "
                     f"{r.share_of_gap:.1%} | {r.oracle_speedup:.3f}× |")  # fmt: skip
    return "\n".join(lines)


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None


DESCRIPTION = (
    "Replay decoding rounds along gen-data's labels (data written with --mix-ratio 1) and price fixed K, "
    "SpecDec++ with a head or with calibrated synthetic heads of given AUROCs, and the hindsight oracle in "
    "counts: N / (c*N_draft + N_target) over autoregressive decoding. Optimistic for every rule alike: a "
    "round's later candidates are judged by first-candidate labels."
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="acchead-headroom", description=DESCRIPTION)
    add = p.add_argument
    add("--data", required=True, help="gen-data directory (written with --mix-ratio 1, the default)")
    add("--head", default=None, help="a lookahead head file to replay on its validation prompts (needs "
        "gen-data's cached states; default: synthetic heads only)")  # fmt: skip
    add("--aurocs", type=_floats, default=[0.7, 0.8, 0.9, 0.95, 0.99],
        help="AUROCs of calibrated synthetic heads, replayed on every prompt (default 0.7,0.8,0.9,0.95,0.99)")
    add("--cost-ratio", type=float, default=0.15, help="draft/target cost ratio c (default 0.15)")
    add("--k-grid", type=_ints, default=[1, 2, 3, 4, 6], help="fixed Ks (default 1,2,3,4,6)")
    add("--h-grid", type=_floats, default=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95],
        help="SpecDec++ thresholds (default 0.1,0.2,...,0.9,0.95)")
    add("--max-draft", type=int, default=20, help="SpecDec++'s cap on candidates per round (default 20)")
    add("--val-fraction", type=float, default=0.1, help="the head's validation share of prompts, as "
        "acchead-train split them (default 0.1)")  # fmt: skip
    add("--seed", type=int, default=0, help="the split seed the head was trained with; also seeds the "
        "synthetic heads (default 0)")  # fmt: skip
    return p


def _responses(data: GenData) -> list[np.ndarray]:
    """Per response, the indices of its positions in position order: one sort, reused for every array."""
    order = np.lexsort((data.position, data.row))  # by row, then position
    cuts = np.flatnonzero(np.diff(data.row[order])) + 1
    return np.split(order, cuts)


def _head_probs(data: GenData, head_path: str) -> np.ndarray:
    """(N,) the head's P(accept) at every position, from gen-data's cached states."""
    import torch

    from acchead.head_io import load_head
    from acchead.train.datamodule import CachedPositions

    head, meta = load_head(head_path, draft=data.draft)  # a head of another draft is refused
    if (trained := meta.sampling_config) != (labelled := SamplingConfig(**data.sampling)):
        raise AccheadError(f"{head_path} was trained under {trained}, {data.path}'s labels under "
                           f"{labelled}: replay a head of the data's S")  # fmt: skip
    if head.kind != "lookahead":
        raise AccheadError(f"{head_path} is a {head.kind} head: the replay judges as a lookahead head does")
    with torch.no_grad():
        x = CachedPositions(data, head.inputs)[np.arange(len(data.labels))]["features"]
        return torch.sigmoid(head.eval()(x).double()).numpy()


@cli_errors
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not 0.0 < args.cost_ratio < math.inf or args.max_draft < 1 or any(k < 1 for k in args.k_grid):
        raise AccheadError("--cost-ratio must be a finite number > 0, --max-draft and every K >= 1")
    if any(not 0.0 < h < 1.0 for h in args.h_grid):
        raise AccheadError("--h-grid values must be in (0, 1)")
    if not args.k_grid or not args.h_grid or not (args.head or args.aurocs):
        raise AccheadError("give at least one K (--k-grid), one h (--h-grid), and --head or --aurocs")
    cfg = read_gen_config(args.data)
    if float(cfg.get("mix_ratio", 1.0)) != 1.0 or int(cfg.get("feature_chain", 1)) > 1:
        raise AccheadError(f"{args.data} was not written along the target's response with first-candidate "
                           "labels: regenerate it with --mix-ratio 1 and --feature-chain 1")  # fmt: skip
    if args.head and not isinstance(cfg.get("lookahead_features"), dict):
        raise AccheadError(f"{args.data} has no cached states: --head needs gen-data's cache (its "
                           "--cache-features), --aurocs does not")  # fmt: skip
    data = load_gen_data(args.data, "cached" if args.head else "auto", "lookahead")
    accept = data.hard  # greedy: the labels themselves; sampling: their seeded Bernoulli draws
    grid = (args.cost_ratio, list(args.k_grid), list(args.h_grid), args.max_draft)
    responses = _responses(data)  # (R,) index arrays
    accepts = [accept[i] for i in responses]
    rows = []
    if args.head:
        in_val = split_by_prompt(data.prompt_index, args.val_fraction, args.seed)[data.row]  # (N,)
        val = [i for i in responses if in_val[i[0]]]
        probs = _head_probs(data, args.head)
        rows.append(headroom(f"{args.head} (validation prompts)", [accept[i] for i in val],
                             [probs[i] for i in val], *grid))  # fmt: skip
    rng = np.random.default_rng(args.seed)
    for u in args.aurocs:
        probs = synthetic_probs(accept, u, rng)
        rows.append(headroom(f"synthetic, AUROC {u:g}", accepts, [probs[i] for i in responses], *grid))
    print(f"{args.data}: {len(responses)} responses, {len(accept)} positions, "
          f"accept rate {accept.mean():.4f}")  # fmt: skip
    print(render(rows, args.cost_ratio))
    return 0
