"""Ship a trained head as the real pair's default under the S it was trained with: its weights rounded to
bfloat16 (the repo keeps the pair's weights bf16, issue 31), its metadata and metrics as trained, and its
name in `defaults.json` under S (the other entries kept).

    python docs/results/smollm2-t1-head-s45/ship_head.py runs/s45/t1/sweep/NAME t1-lookahead
    python docs/results/smollm2-t1-head-s45/ship_head.py runs/s44/demo-smollm2/head greedy-lookahead

Prints the validation AUROC of the float32 head and of the rounded one on the same positions (as training
computes it: against the realised accept events, a Bernoulli draw of each soft label; under greedy S the
labels are 0 or 1 and the events are the labels).
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

src, name = Path(sys.argv[1]), sys.argv[2]
head, meta = load_head(src / "head.safetensors")
out = SMOLLM2_HEADS_DIR / name
save_head(head.to(torch.bfloat16), out / "head.safetensors", meta=meta)
shutil.copy(src / "metrics.json", out / "metrics.json")
defaults_file = SMOLLM2_HEADS_DIR / "defaults.json"
defaults = json.loads(defaults_file.read_text()) if defaults_file.is_file() else {}
defaults[str(meta.sampling_config)] = name
defaults_file.write_text(json.dumps(defaults, indent=2) + "\n")

data = load_gen_data(meta.data["path"], kind="lookahead")
val = split_by_prompt(data.prompt_index, meta.data["val_fraction"], meta.data["split_seed"])
idx = np.flatnonzero(val[data.row])
batch = CachedPositions(data, head.inputs)[idx]
x, y = batch["features"], batch["hard"].long()  # training's AUROC: against the realised accept events
shipped, _ = load_head(out / "head.safetensors")
with torch.no_grad():
    f32, _ = load_head(src / "head.safetensors")
    print(f"{name} ({meta.sampling_config}): validation AUROC float32 {float(binary_auroc(f32(x), y)):.4f}, "
          f"bfloat16 {float(binary_auroc(shipped(x).float(), y)):.4f} ({len(idx)} positions), "
          f"{(out / 'head.safetensors').stat().st_size} bytes")
