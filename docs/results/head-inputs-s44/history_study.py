"""Offline probe: do the draft's recent outcomes in a row tell its misses apart better than the head's inputs?

Logistic regression on (a) the head's statistics (log q, entropy, top-8 log-probs), (b) those plus a
history of the row's earlier labels, lagged by L positions (a round's k-th candidate sees outcomes up to
the round's start, so L = k). Validation AUROC over the demo's four prompt splits (seeds 0-3).
"""
import sys

import numpy as np
import torch
from probe_fit import fit_auroc

from acchead.train.data import load_gen_data, split_by_prompt
from acchead.train.datamodule import CachedPositions

path = sys.argv[1]
d = load_gen_data(path, kind="lookahead")
ds = CachedPositions(d, ("state", "logq", "entropy", "topk"))
stats = ds.stats.float()  # (N, W)
y = torch.from_numpy(d.labels).float()
print("positions", len(y), "stats", tuple(stats.shape), "mean label", float(y.mean()))


def history(lag: int, alpha: float) -> torch.Tensor:
    """(N, 3): EMA of the row's labels up to position i - lag, how many there were (log1p), the last one."""
    out = np.zeros((len(y), 3), dtype=np.float32)
    lab = d.labels
    for r in range(d.num_rows):
        idx = np.flatnonzero(d.row == r)
        idx = idx[np.argsort(d.position[idx])]
        ema, n = 0.6, 0
        seen = []
        for j, i in enumerate(idx):
            k = j - lag  # the newest label this candidate may see
            while len(seen) <= k:
                v = lab[idx[len(seen)]]
                seen.append(v)
                ema = (1 - alpha) * ema + alpha * v
                n += 1
            out[i] = (ema, np.log1p(n), seen[k] if k >= 0 else 0.6)
    return torch.from_numpy(out)


hist = {(lag, a): history(lag, a) for lag in (1, 2, 3) for a in (0.1, 0.3, 0.6)}
rows_prompt = d.prompt_index
for seed in range(4):
    val_rows = split_by_prompt(rows_prompt, 0.1, seed)
    val = torch.from_numpy(val_rows[d.row])
    train = ~val
    line = [f"seed {seed}: stats {fit_auroc(stats, y, train, val):.3f}"]
    for (lag, a), h in hist.items():
        line.append(f"L{lag}a{a} {fit_auroc(torch.cat([stats, h], 1), y, train, val):.3f}")
        if a == 0.3:
            line.append(f"(hist only {fit_auroc(h, y, train, val):.3f})")
    print("  ".join(line), flush=True)
