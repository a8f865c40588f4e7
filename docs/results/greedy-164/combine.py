"""Issue 10's greedy goals over both halves of a prompt set: the bench's per-prompt partial results summed.

    python docs/results/greedy-164/combine.py he   # reads work/exp14/bench-he-{a,b}/partial (big_bench.sh)

Prints the cost fit over every fitted family's runs (as acchead-bench fits it), each method's best setting
at c = 0.2 and at the fitted costs, and the goals.
"""

import json
import sys
from collections import defaultdict
from pathlib import Path

from acchead.inference.bench.costmodel import fit_costs
from acchead.inference.bench.settings import FIT_FAMILIES


def family_of(key: str) -> str:
    """The method family of a partial-result key, e.g. 'specdec_k=3-token' -> 'specdec'."""
    fam = key.removesuffix("-token").split("_")[0]
    return "adaedl-adapt" if fam == "adaedl" and key.endswith("adapt=1-token") else fam


def main(name: str) -> None:
    runs: dict[str, list[dict]] = defaultdict(list)
    for part in "ab":
        for f in sorted(Path(f"work/exp14/bench-{name}-{part}/partial").glob("prompt-*.json")):
            for key, r in json.loads(f.read_text())["runs"].items():
                runs[key].append({**r, "prompt": f"{part}{r['prompt']}"})
    # Keep the prompts every setting finished (all of them once both halves are done).
    complete = set.intersection(*({r["prompt"] for r in v} for v in runs.values()))
    runs = {k: [r for r in v if r["prompt"] in complete] for k, v in runs.items()}
    family = {k: family_of(k) for k in runs}
    fitted = [r for k, v in runs.items() if family[k] in FIT_FAMILIES for r in v]
    fit = fit_costs(*([r[x] for r in fitted] for x in ("draft_calls", "target_calls", "wall_time")))
    ar = {r["prompt"]: r["output_sha"] for r in runs["autoregressive-token"]}
    tot = {}
    for k, v in runs.items():
        n, nt, nd = (sum(r[x] for r in v) for x in ("tokens", "target_calls", "draft_calls"))
        tot[k] = {
            "c02": n / (0.2 * nd + nt),
            "fitted": n / (fit.t_draft * nd + fit.t_target * nt),
            "same": sum(ar[r["prompt"]] == r["output_sha"] for r in v) / len(v),
        }

    def best(fam: str, metric: str = "c02") -> tuple[str, float]:
        k = max((k for k in tot if family[k] == fam), key=lambda k: tot[k][metric])
        return k, tot[k][metric]

    print(
        f"{name}: {len(complete)} prompts; fit t_draft {fit.t_draft * 1e3:.3f} ms t_target "
        f"{fit.t_target * 1e3:.3f} ms (c = {fit.t_draft / fit.t_target:.3f}, R2 {fit.r2:.3f}, "
        f"{fit.n_runs} runs)"
    )
    print("outputs equal to autoregressive:", min(t["same"] for t in tot.values()))
    for fam in sorted(set(family.values())):
        k, v = best(fam)
        print(f"  best {fam:22s} c=0.2 {v:.4f}  ({k})   fitted {best(fam, 'fitted')[1]:.2f} tok/s")
    s, k, o = best("specdecpp-lookahead")[1], best("specdec")[1], best("oracle")[1]
    conf = best("confidence")[1]
    ada = max(best("adaedl")[1], best("adaedl-adapt")[1])
    s_fit, k_fit = best("specdecpp-lookahead", "fitted")[1], best("specdec", "fitted")[1]
    h8 = next(v["c02"] for k, v in tot.items() if family[k] == "specdecpp-lookahead" and "h=0.8_" in k)
    print(
        f"GOALS {name}: vs best K {s / k:.4f} (>=1.15) | fitted {s_fit / k_fit:.4f} (>=1.15) | vs confidence "
        f"{s / conf:.4f} | vs AdaEDL {s / ada:.4f} (>=1.05) | gap {(s - k) / (o - k):.1%} (>=35%) | h=0.8 "
        f"{h8 / s:.2%} of best (>=98%)"
    )


if __name__ == "__main__":
    main(sys.argv[1])
