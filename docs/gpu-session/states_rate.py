"""Call 2: how fast --target-states computes the fused states of response shards on this GPU."""
import time
from pathlib import Path

import torch

from acchead.assets import TARGET_DIR_NAME, asset_path
from acchead.distill.stages import to_device
from acchead.distill.train_stage import _states_reader
from acchead.models import load_causal_lm

t = to_device(load_causal_lm(asset_path(TARGET_DIR_NAME)), "cuda")
read = _states_reader(None, t, (2, 15, 27))
paths = sorted(Path("/root/data/responses").glob("shard-*.npz"))[355:385]
read("/root/data/responses", paths[:2])
torch.cuda.synchronize()
s = time.perf_counter()
out = read("/root/data/responses", paths[2:])
torch.cuda.synchronize()
dt = time.perf_counter() - s
print(f"states: {len(paths) - 2} shards in {dt:.1f} s = {(len(paths) - 2) / dt:.2f} shards/s; first item: "
      f"{type(out[0]).__name__}")
