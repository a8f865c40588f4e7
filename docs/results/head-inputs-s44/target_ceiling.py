"""Offline probe: how much would the target's own uncertainty at a position tell a head?

Runs the target over each demo row (prompt + its own greedy response), takes at every response position i
the target's max log-prob, entropy and top-1/top-2 margin, at lag 0 (position i itself: what no head can
see before verifying) and lag L >= 1 (the last verified positions: what a decoder has). Logistic
regression with the draft's statistics (log q, entropy, top-8), validation AUROC on the four demo splits.
"""
import sys

import numpy as np
import torch
from datasets import load_from_disk
from probe_fit import fit_auroc
from torchmetrics.functional.classification import binary_auroc
from transformers import AutoModelForCausalLM

from acchead.pairs import resolve_pair
from acchead.train.data import load_gen_data, split_by_prompt
from acchead.train.datamodule import CachedPositions

torch.set_num_threads(2)
path = sys.argv[1]
d = load_gen_data(path, kind="lookahead")
stats = CachedPositions(d, ("state", "logq", "entropy", "topk")).stats.float()
y = torch.from_numpy(d.labels).float()
ds = load_from_disk(path)
target = AutoModelForCausalLM.from_pretrained(resolve_pair("smollm2").target, dtype=torch.float32).eval()

tstats = np.zeros((len(y), 3), dtype=np.float32)  # lag 0: max log p, entropy, margin
per_row = {}
with torch.inference_mode():
    for r in range(d.num_rows):
        rec = ds[r]
        p, resp = rec["prompt_ids"], rec["mixed_ids"]
        ids = torch.tensor([p + resp])
        logp = torch.log_softmax(target(ids).logits[0, len(p) - 1 : len(p) - 1 + len(resp)].float(), -1)
        top2 = logp.topk(2, -1).values
        ent = -(logp.exp() * logp).sum(-1)
        per_row[r] = torch.stack([top2[:, 0], ent, top2[:, 0] - top2[:, 1]], 1).numpy()
        # sanity: greedy label = [draft's token == target's argmax]
        agree = (logp.argmax(-1).numpy() == np.array(rec["draft_ids"])).astype(np.float32)
        assert np.allclose(agree, rec["accept_prob"]), r
        if r % 32 == 0:
            print("row", r, flush=True)

for i in range(len(y)):
    r, pos = d.row[i], d.position[i]
    tstats[i] = per_row[r][pos]


def lagged(lag: int) -> torch.Tensor:
    out = np.zeros_like(tstats)
    for i in range(len(y)):
        r, pos = d.row[i], d.position[i]
        out[i] = per_row[r][pos - lag] if pos - lag >= 0 else per_row[r][:1].mean(0) * 0
    return torch.from_numpy(out)


t0 = torch.from_numpy(tstats)
sets = {
    "draft stats": stats,
    "target lag0 alone": t0,
    "draft + target lag0": torch.cat([stats, t0], 1),
    "draft + target lag1": torch.cat([stats, lagged(1)], 1),
    "draft + target lag1..3": torch.cat([stats, lagged(1), lagged(2), lagged(3)], 1),
}
res = {k: [] for k in sets}
for seed in range(4):
    val = torch.from_numpy(split_by_prompt(d.prompt_index, 0.1, seed)[d.row])
    for k, x in sets.items():
        res[k].append(fit_auroc(x, y, ~val, val))
for k, v in res.items():
    print(f"{k:28s}", " / ".join(f"{a:.3f}" for a in v), f"mean {np.mean(v):.3f}")


def fit_mlp_auroc(x, train, val, seed=0):
    torch.manual_seed(seed)
    mu, sd = x[train].mean(0), x[train].std(0) + 1e-6
    x = (x - mu) / sd
    net = torch.nn.Sequential(torch.nn.Linear(x.shape[1], 64), torch.nn.SiLU(), torch.nn.Linear(64, 64),
                              torch.nn.SiLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3, weight_decay=1e-2)
    xt, yt = x[train], y[train]
    for _ in range(300):
        opt.zero_grad()
        torch.nn.functional.binary_cross_entropy_with_logits(net(xt)[:, 0], yt).backward()
        opt.step()
    with torch.no_grad():
        return float(binary_auroc(net(x[val])[:, 0], y[val].long()))


print("MLP (2 x 64, 300 full-batch steps):")
for k in ("draft stats", "draft + target lag0", "draft + target lag1..3"):
    v = []
    for seed in range(4):
        val = torch.from_numpy(split_by_prompt(d.prompt_index, 0.1, seed)[d.row])
        v.append(fit_mlp_auroc(sets[k], ~val, val))
    print(f"{k:28s}", " / ".join(f"{a:.3f}" for a in v), f"mean {np.mean(v):.3f}")
