"""A/B in one process, 1 thread: SmolLM2's target with its layers compiled as regions two ways,
  s46: each layer traced anew, weights frozen (the forty-sixth session's units: its compile_regions.py, read
       from git at 9697d5d);
  s47: one traced layer reused for all 30 (its cache tensors as the region's inputs), weights not frozen;
each unit's compile time, the logits against the eager static cache, then each width's step time, the two
runners alternating in order.
    TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) python ab.py MODEL_DIR WIDTHS ROUNDS"""

import copy
import functools
import math
import os
import subprocess
import sys
import time
import types

import torch
from transformers import AutoModelForCausalLM

from acchead.inference import compiled_units, static_runner
from acchead.inference.device_path import DevicePath
from acchead.inference.static_runner import StaticRunner

s46 = types.ModuleType("compile_regions_s46")
git_show = ["git", "show", "9697d5d:inference/compile_regions.py"]
source = subprocess.run(git_show, capture_output=True, text=True, check=True)
exec(compile(source.stdout, "compile_regions_s46.py", "exec"), s46.__dict__)

path, widths, rounds = sys.argv[1], [int(w) for w in sys.argv[2].split(",")], int(sys.argv[3])
torch.set_num_threads(1)
a_model = AutoModelForCausalLM.from_pretrained(os.path.expanduser(path), dtype=torch.float32).eval()
b_model, e_model = copy.deepcopy(a_model), copy.deepcopy(a_model)


class Freeze:
    """compile_units' Inductor settings with freezing on, as the forty-sixth session compiled."""

    @staticmethod
    def partial(f, settings, *args):
        return functools.partial(f, {**settings, "freezing": True}, *args)


# The s46 runner: its units compile (when the runner is built) with freezing and s46's marks.
saved = compiled_units.functools, static_runner.regions_for
compiled_units.functools, static_runner.regions_for = Freeze, s46.regions_for
runners = {"s46": StaticRunner(a_model, capacity=512, device_path=DevicePath(False, regional=True))}
compiled_units.functools, static_runner.regions_for = saved
runners["s47"] = StaticRunner(b_model, capacity=512, device_path=DevicePath(False, regional=True))
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
                print(f"{name} compile width {w}: {seconds:.1f} s", flush=True)
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
ratios = [medians[("s47", w)] / medians[("s46", w)] for w in widths]
for w, ratio in zip(widths, ratios, strict=True):
    fastest = [min(times[(n, w)]) * 1000 for n in ("s46", "s47")]
    print(f"width {w}: median s46 {medians[('s46', w)]:.2f} ms, s47 {medians[('s47', w)]:.2f} ms (ratio "
          f"{ratio:.3f}); fastest {fastest[0]:.2f} / {fastest[1]:.2f} ms")
print(f"geometric mean ratio s47/s46 {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}")
