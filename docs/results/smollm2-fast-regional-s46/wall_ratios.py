"""Wall-clock ratios of a fast-path bench: every row's tokens/s, and the best SpecDec++ over the best fixed
K, our AR and HF `generate`.   python wall_ratios.py RESULTS.json..."""

import json
import sys
from pathlib import Path

for path in sys.argv[1:]:
    data = json.loads(Path(path).read_text())
    rows = data["rows"]
    speed = {(r["method"], r["spec"]): r["wall_tokens_per_s"] for r in rows}
    same = {(r["method"], r["spec"]): r["matches_autoregressive"] for r in rows}
    spd = max(v for (m, _), v in speed.items() if m.startswith("specdecpp"))
    best_k = max(v for (m, _), v in speed.items() if m.startswith("specdec@"))
    ar = next(v for (m, _), v in speed.items() if m.startswith("autoregressive"))
    hf = next(v for (m, _), v in speed.items() if m == "hf-generate")
    print(f"{path}: warm-up {data['warm_up_s']:.1f} s")
    for (m, spec), v in speed.items():
        print(f"  {m:26s} {spec:34s} {v:6.2f} tok/s, greedy = AR on {same[m, spec]:.0%}")
    print(f"  best SpecDec++ / best K {spd / best_k:.3f}x, / AR {spd / ar:.3f}x,"
          f" / HF generate {spd / hf:.3f}x; AR / HF {ar / hf:.3f}x")
