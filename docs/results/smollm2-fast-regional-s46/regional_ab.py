"""A/B: one model compiled whole (C++ wrapper) and a copy compiled with its layers as regions (Python
wrapper), in one process, 1 thread: compile time per unit (cold with an empty TORCHINDUCTOR_CACHE_DIR), the
logits of the two, then each width's step time, the two runners alternating in order.
    TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) python regional_ab.py MODEL_DIR WIDTHS ROUNDS"""
import copy
import os
import sys
import time

import torch
from transformers import AutoModelForCausalLM

from acchead.inference.device_path import DevicePath
from acchead.inference.static_runner import StaticRunner

path = sys.argv[1]
widths = [int(w) for w in sys.argv[2].split(",")]
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 20
torch.set_num_threads(1)
a_model = AutoModelForCausalLM.from_pretrained(os.path.expanduser(path), torch_dtype=torch.float32).eval()
b_model = copy.deepcopy(a_model)
runners = {"whole": StaticRunner(a_model, capacity=512, device_path=DevicePath(False, regional=False)),
           "regional": StaticRunner(b_model, capacity=512, device_path=DevicePath(False, regional=True))}
prompt = torch.randint(0, 4000, (30,))
times = {(n, w): [] for n in runners for w in widths}
with torch.inference_mode():
    for name, r in runners.items():
        r.reset(512)
        r.feed(prompt)
        for w in widths:
            x = torch.randint(0, 4000, (w,))
            t = time.perf_counter()
            r.feed(x, keep=w)
            dt = time.perf_counter() - t
            print(f"{name} compile width {w}: {dt:.1f} s", flush=True)
            r.rollback(30)
    for w in widths:
        x = torch.randint(0, 4000, (w,))
        outs = {n: r.feed(x, keep=w)[0] for n, r in runners.items()}
        for r in runners.values():
            r.rollback(30)
        print(f"width {w}: max |logit diff| {(outs['whole'] - outs['regional']).abs().max().item():.2e}, "
              f"argmax equal {bool((outs['whole'].argmax(-1) == outs['regional'].argmax(-1)).all())}")
    for i in range(rounds):
        order = list(runners.items()) if i % 2 == 0 else list(runners.items())[::-1]
        for w in widths:
            x = torch.randint(0, 4000, (w,))
            for name, r in order:
                t = time.perf_counter()
                r.feed(x, keep=w)
                times[(name, w)].append(time.perf_counter() - t)
                r.rollback(30)
for w in widths:
    med = {n: sorted(times[(n, w)])[len(times[(n, w)]) // 2] * 1000 for n in runners}
    low = {n: min(times[(n, w)]) * 1000 for n in runners}
    print(f"width {w}: median whole {med['whole']:.2f} ms, regional {med['regional']:.2f} ms "
          f"(ratio {med['regional'] / med['whole']:.3f}); "
          f"fastest {low['whole']:.2f} / {low['regional']:.2f} ms")
