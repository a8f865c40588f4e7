"""SmolLM2's target units compiled on an empty cache, the store off, one width after another: each unit's
ready time, then dynamo's compile times by phase, summed over the units.
    ACCHEAD_UNIT_STORE=0 TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) python prof_unit.py 2,5"""
import os
import sys
import time

import torch
from torch._dynamo.utils import compile_times
from transformers import AutoModelForCausalLM

from acchead.inference.device_path import DevicePath
from acchead.inference.static_runner import StaticRunner

torch.set_num_threads(1)
target = os.path.expanduser("~/.cache/acchead/assets/smollm2-target")
m = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
r = StaticRunner(m, capacity=512, device_path=DevicePath(False, regional=True))
with torch.inference_mode():
    r.reset(64)
    r.feed(torch.randint(0, 4000, (30,)))
    for w in [int(x) for x in sys.argv[1].split(",")]:
        t = time.perf_counter()
        r.feed(torch.randint(0, 4000, (w,)), keep=w)
        print(f"width {w}: ready in {time.perf_counter() - t:.1f} s", flush=True)
        r.rollback(30)
print(compile_times(repr="str", aggregate=True))
