"""Best SpecDec++ of each head over the best fixed K at c = 0.15 (counts), and its share of the way to the
oracle, from bench results.json files."""
import json
import sys
from collections import defaultdict
from pathlib import Path


def sp(r: dict) -> float:
    """Speed-up over AR in target-forward units at c = 0.15."""
    return r["tokens"] / (0.15 * r["draft_calls"] + r["target_calls"])


for path in sys.argv[1:]:
    rows = json.loads(Path(path).read_text())["rows"]
    k = max(sp(r) for r in rows if r["method"] == "specdec")
    oracles = [sp(r) for r in rows if r["method"] == "oracle"]  # greedy only
    o = max(oracles) if oracles else None
    best = defaultdict(float)
    for r in rows:
        if r["method"].startswith("specdecpp"):
            best[r["method"]] = max(best[r["method"]], sp(r))
    print(path, f"best K {k:.3f}x", f"oracle {o:.3f}x" if o else "no oracle")
    for m, v in best.items():
        way = f", {100 * (v - k) / (o - k):.1f}% of the way" if o else ""
        print(f"  {m}: {v:.3f}x = {v / k:.3f}x the best K{way}")
