"""A/B in one process, 1 thread: SmolLM2's target with its layers compiled as regions, each unit
  traced: traced by dynamo in this process (the store switched off: the forty-seventh session's units);
  loaded: loaded from the store of compiled units (acchead.inference.unit_store), filled by a first run;
each unit's ready time, the logits against the eager static cache, then each width's step time, the two
runners alternating in order. Run it twice on one store; the second run's units are loaded.
    TORCHINDUCTOR_CACHE_DIR=DIR python ab.py MODEL_DIR WIDTHS ROUNDS"""

import copy
import math
import os
import sys
import time

import torch
from transformers import AutoModelForCausalLM

from acchead.inference import compiled_units
from acchead.inference.device_path import DevicePath
from acchead.inference.static_runner import StaticRunner
from acchead.inference.unit_store import STORE_ENV, UnitStore

path, widths, rounds = sys.argv[1], [int(w) for w in sys.argv[2].split(",")], int(sys.argv[3])
torch.set_num_threads(1)
a_model = AutoModelForCausalLM.from_pretrained(os.path.expanduser(path), dtype=torch.float32).eval()
b_model, e_model = copy.deepcopy(a_model), copy.deepcopy(a_model)
regional = DevicePath(False, regional=True)
store_dir = os.environ.get(STORE_ENV)
os.environ[STORE_ENV] = "0"  # the traced runner's units never touch the store
runners = {"traced": StaticRunner(a_model, capacity=512, device_path=regional)}
if store_dir is None:
    os.environ.pop(STORE_ENV)
else:
    os.environ[STORE_ENV] = store_dir
hits = []
default = UnitStore.default


def counted() -> UnitStore | None:
    store = default()
    hits.append(store)
    return store


compiled_units.UnitStore.default = counted
runners["loaded"] = StaticRunner(b_model, capacity=512, device_path=regional)
eager = StaticRunner(e_model, capacity=512, compile=False)
prompt = torch.randint(0, 4000, (30,))
times = {(n, w): [] for n in runners for w in widths}


def timed_feed(runner: StaticRunner, width: int) -> tuple[torch.Tensor, float]:
    """One unit of `width` random tokens after the prompt, rolled back: its logits and seconds."""
    start = time.perf_counter()
    logits = runner.feed(torch.randint(0, 4000, (width,)), keep=width)[0]
    seconds = time.perf_counter() - start
    runner.rollback(len(prompt))
    return logits, seconds


with torch.inference_mode():
    for name, r in [*runners.items(), ("eager", eager)]:
        r.reset(512)
        r.feed(prompt)
        for w in widths:
            seconds = timed_feed(r, w)[1]
            if name != "eager":
                print(f"{name} ready width {w}: {seconds:.2f} s", flush=True)
    store = next(s for s in hits if s is not None)
    print(f"store {store.root}: {store.hits} loaded, {store.saves} stored")
    for w in widths:
        state = torch.random.get_rng_state()
        ref = timed_feed(eager, w)[0]
        for n, r in runners.items():
            torch.random.set_rng_state(state)  # the same tokens as the eager cache's
            out = timed_feed(r, w)[0]
            print(f"width {w} {n}: max |logit - eager| {(out - ref).abs().max().item():.2e}, "
                  f"argmax equal {bool((out.argmax(-1) == ref.argmax(-1)).all())}")
    for i in range(rounds):  # each round every width once per runner, the runners' order alternating
        for w in widths:
            for name in list(runners)[:: 1 if i % 2 == 0 else -1]:
                times[(name, w)].append(timed_feed(runners[name], w)[1])
medians = {k: sorted(v)[len(v) // 2] * 1000 for k, v in times.items()}
ratios = [medians[("loaded", w)] / medians[("traced", w)] for w in widths]
for w, ratio in zip(widths, ratios, strict=True):
    fastest = [min(times[(n, w)]) * 1000 for n in ("traced", "loaded")]
    print(f"width {w}: median traced {medians[('traced', w)]:.2f} ms, loaded {medians[('loaded', w)]:.2f} ms "
          f"(ratio {ratio:.3f}); fastest {fastest[0]:.2f} / {fastest[1]:.2f} ms")
print(f"geometric mean ratio loaded/traced {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}")
