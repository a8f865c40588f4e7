"""Toy target at B = 1 on the batched fast path: a verification's forward time per width, static graphs
for every width (SYMBOLIC_FROM raised) against the default (symbolic from 5); interleaved repeats."""
import sys
import time

import torch

import acchead.inference.static_ragged_cache as src
from acchead.models import load_causal_lm
from acchead.pairs import resolve_pair

torch.set_num_threads(1)
target = load_causal_lm(resolve_pair("toy").target)
batch = int(sys.argv[1]) if len(sys.argv) > 1 else 1
widths = [int(w) for w in (sys.argv[2] if len(sys.argv) > 2 else "4,5,6,8,12").split(",")]
prompt = torch.randint(5, 1000, (batch, 100))
caches = {}
for name, sym in (("symbolic", 5), ("static", 1000)):
    src.SYMBOLIC_FROM = sym
    caches[name] = (src.StaticRaggedCache(target), sym)
times = {}
with torch.inference_mode():
    for rep in range(14):
        for name, (cache, sym) in caches.items():
            src.SYMBOLIC_FROM = sym
            for w in widths:
                cache.reset(batch, 256)
                cache.feed(prompt, torch.full((batch,), 100), keep=1)
                ids = torch.randint(5, 1000, (batch, w))
                t = time.perf_counter()
                cache.feed(ids, torch.full((batch,), w), keep=w)
                if rep >= 2:
                    times.setdefault((name, w), []).append(time.perf_counter() - t)
for (name, w), v in sorted(times.items()):
    print(batch, name, w, round(sorted(v)[len(v) // 2] * 1e3, 2), flush=True)
