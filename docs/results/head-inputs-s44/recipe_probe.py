"""Offline probe: which part of the recipe costs the head AUROC on the draft's statistics: input scaling,
the rejection weight, or the training length? A 2 x 64 MLP on (log q, entropy, top-8), four splits."""
import sys

import numpy as np
import torch
from torchmetrics.functional.classification import binary_auroc

from acchead.head import AcceptanceHead
from acchead.loss import weighted_bce_with_logits
from acchead.train.data import load_gen_data, split_by_prompt
from acchead.train.datamodule import CachedPositions

torch.set_num_threads(2)
d = load_gen_data(sys.argv[1], kind="lookahead")
stats = CachedPositions(d, ("state", "logq", "entropy", "topk")).stats.float()
y = torch.from_numpy(d.labels).float()


def run(x, train, val, standardize, w_rej, steps, arch, seed=0):
    torch.manual_seed(seed)
    if standardize:
        mu, sd = x[train].mean(0), x[train].std(0) + 1e-6
        x = (x - mu) / sd
    if arch == "mlp":
        net = torch.nn.Sequential(torch.nn.Linear(x.shape[1], 64), torch.nn.SiLU(), torch.nn.Linear(64, 64),
                                  torch.nn.SiLU(), torch.nn.Linear(64, 1))
        f = lambda z: net(z)[:, 0]  # noqa: E731
    else:
        net = AcceptanceHead(x.shape[1], depth=3, kind="lookahead", inputs=("state",), width=32)
        f = net
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    xt, yt = x[train], y[train]
    for _ in range(steps):
        opt.zero_grad()
        weighted_bce_with_logits(f(xt), yt, w_acc=1.0, w_rej=w_rej).backward()
        opt.step()
    with torch.no_grad():
        return float(binary_auroc(f(x[val]), y[val].long()))


for arch in ("head", "mlp"):
    for standardize in (False, True):
        for w_rej in (1.0, 6.0):
            for steps in (150, 400):
                v = []
                for seed in range(4):
                    val = torch.from_numpy(split_by_prompt(d.prompt_index, 0.1, seed)[d.row])
                    v.append(run(stats, ~val, val, standardize, w_rej, steps, arch))
                print(f"{arch} std={standardize!s:5} w_rej={w_rej} steps={steps}:",
                      " / ".join(f"{a:.3f}" for a in v), f"mean {np.mean(v):.3f}", flush=True)
