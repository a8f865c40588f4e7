"""Ship `make demo`'s head as the real pair's default greedy head: its weights rounded to bfloat16 (the
repo keeps the pair's weights bf16, issue 31), its metadata and metrics as trained.

    python docs/results/smollm2-demo-s44/ship_head.py runs/s44/demo-smollm2/head

Prints the validation AUROC of the float32 head and of the rounded one on the same positions.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
from torchmetrics.functional.classification import binary_auroc

from acchead.head_io import load_head, save_head
from acchead.pairs import SMOLLM2_HEADS_DIR
from acchead.train.data import load_gen_data, split_by_prompt
from acchead.train.datamodule import CachedPositions

src = Path(sys.argv[1])
head, meta = load_head(src / "head.safetensors")
out = SMOLLM2_HEADS_DIR / "greedy-lookahead"
save_head(head.to(torch.bfloat16), out / "head.safetensors", meta=meta)
shutil.copy(src / "metrics.json", out / "metrics.json")
(SMOLLM2_HEADS_DIR / "defaults.json").write_text(json.dumps({"greedy": "greedy-lookahead"}, indent=2) + "\n")

data = load_gen_data(meta.data["path"], kind="lookahead")
val = split_by_prompt(data.prompt_index, meta.data["val_fraction"], meta.data["split_seed"])
idx = np.flatnonzero(val[data.row])
x = CachedPositions(data, head.inputs)[idx]["features"]
y = torch.from_numpy(data.labels[idx]).long()
shipped, _ = load_head(out / "head.safetensors")
with torch.no_grad():
    f32, _ = load_head(src / "head.safetensors")
    print(f"validation AUROC: float32 {float(binary_auroc(f32(x), y)):.4f}, "
          f"bfloat16 {float(binary_auroc(shipped(x), y)):.4f} ({len(idx)} positions)")
