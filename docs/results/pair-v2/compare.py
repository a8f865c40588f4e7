"""Each method's best setting at c = 0.2 on pair v1 and pair v2, from two `acchead-bench` results.json
files on the same prompts and seeds: a markdown table (issue 21: how each method moves from v1 to v2).

    python docs/results/pair-v2/compare.py docs/results/greedy-humaneval/results.json \
        work/v2bench/final-greedy-humaneval/results.json
"""

from __future__ import annotations

import json
import sys

RATIO = "0.2"
LABELS = {  # row method (head suffix stripped) -> table label
    "autoregressive": "autoregressive",
    "specdec": "best fixed K",
    "specdecpp-lookahead": "SpecDec++, shipped lookahead head",
    "specdecpp": "SpecDec++, candidate head (the paper's)",
    "confidence": "confidence threshold",
    "entropy": "entropy threshold",
    "adaedl": "AdaEDL, fixed λ",
    "adaedl-adapt": "AdaEDL, online λ",
    "hf-assisted": "HF assisted generation (counts)",
    "mag": "Max-Gram drafter (no draft model)",
    "cascade": "cascade (draft reviews MaG)",
    "oracle": "hindsight oracle",
}


def best_rows(path: str) -> dict[str, dict]:
    """method label -> its best row at c = 0.2; only the shipped heads' SpecDec++ rows count."""
    best: dict[str, dict] = {}
    with open(path) as f:
        rows = json.load(f)["rows"]
    for row in rows:
        head = str(row["params"].get("head", ""))
        if head and "acchead/zoo/heads/" not in head:
            continue  # a study head benched beside the shipped ones
        method = row["method"].split("[")[0]
        if method not in LABELS:
            continue
        if method not in best or row["ratio_speedups"][RATIO] > best[method]["ratio_speedups"][RATIO]:
            best[method] = row
    return best


def setting(row: dict) -> str:
    p = {k: v for k, v in row["params"].items() if k not in ("head", "max", "gamma", "spec")}
    return ", ".join(f"{k}={v}" for k, v in p.items()) if p and row["method"] != "hf-assisted" else ""


def main(v1: str, v2: str) -> None:
    a, b = best_rows(v1), best_rows(v2)
    print(f"| method, best setting at c = {RATIO} | pair v1 | pair v2 | v2 / v1 |")
    print("|---|---|---|---|")
    for method, label in LABELS.items():
        if method not in a and method not in b:
            continue
        cells = []
        for rows in (a, b):
            r = rows.get(method)
            cells.append(f"{r['ratio_speedups'][RATIO]:.3f}× ({setting(r)})".replace(" ()", "") if r else "–")
        move = (f"{b[method]['ratio_speedups'][RATIO] / a[method]['ratio_speedups'][RATIO]:.2f}"
                if method in a and method in b else "–")
        print(f"| {label} | {cells[0]} | {cells[1]} | {move} |")


if __name__ == "__main__":
    main(*sys.argv[1:3])
