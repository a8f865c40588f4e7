"""Offline probe: does the draft's state (576) help or hurt a small MLP beside its statistics (10)?"""
import sys

import numpy as np
import torch
from torchmetrics.functional.classification import binary_auroc

from acchead.train.data import load_gen_data, split_by_prompt
from acchead.train.datamodule import CachedPositions

torch.set_num_threads(2)
d = load_gen_data(sys.argv[1], kind="lookahead")
stats = CachedPositions(d, ("state", "logq", "entropy", "topk")).stats.float()
state = torch.from_numpy(np.ascontiguousarray(d.features[d.feature_index])).float()
y = torch.from_numpy(d.labels).float()


def fit_mlp_auroc(x, train, val, steps, wd, seed=0):
    torch.manual_seed(seed)
    mu, sd = x[train].mean(0), x[train].std(0) + 1e-6
    x = (x - mu) / sd
    net = torch.nn.Sequential(torch.nn.Linear(x.shape[1], 64), torch.nn.SiLU(), torch.nn.Linear(64, 64),
                              torch.nn.SiLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3, weight_decay=wd)
    xt, yt = x[train], y[train]
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.binary_cross_entropy_with_logits(net(xt)[:, 0], yt).backward()
        opt.step()
    with torch.no_grad():
        return float(binary_auroc(net(x[val])[:, 0], y[val].long()))


for name, x in (("stats", stats), ("state+stats", torch.cat([state, stats], 1)), ("state", state)):
    for steps in (100, 300):
        v = []
        for seed in range(4):
            val = torch.from_numpy(split_by_prompt(d.prompt_index, 0.1, seed)[d.row])
            v.append(fit_mlp_auroc(x, ~val, val, steps, 1e-2))
        aurocs = " / ".join(f"{a:.3f}" for a in v)
        print(f"{name:12s} steps {steps}:", aurocs, f"mean {np.mean(v):.3f}", flush=True)
