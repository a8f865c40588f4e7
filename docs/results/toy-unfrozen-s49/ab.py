"""A/B in one process, 1 thread: the demo (toy) pair's units on the CPU fast path compiled two ways,
  frozen:   the default for a narrow model (Inductor's weight freezing and C++ wrapper; never stored);
  unfrozen: whole, its weights as inputs (a regional unit's settings: Python wrapper, no freezing), as the
            real pair's one-layer draft compiles since the forty-eighth session, and so stored;
  unfrozen_cpp: the same with Inductor's C++ wrapper (a whole unit calls no subgraph), stored too;
each unit's ready time, the logits against the eager static cache, then each width's step time, the
runners alternating in order. Run twice on one cache directory: the second run loads the unfrozen units.
    TORCHINDUCTOR_CACHE_DIR=DIR python ab.py target|draft WIDTHS ROUNDS"""

import contextlib
import copy
import functools
import math
import sys
import time

import torch

from acchead.inference import compiled_units, static_runner
from acchead.inference.device_path import DevicePath
from acchead.inference.static_runner import StaticRunner
from acchead.models import load_causal_lm
from acchead.pairs import resolve_pair

which, widths, rounds = sys.argv[1], [int(w) for w in sys.argv[2].split(",")], int(sys.argv[3])
torch.set_num_threads(1)
pair = resolve_pair("toy")
a_model = load_causal_lm(pair.target if which == "target" else pair.draft)
b_model, e_model = copy.deepcopy(a_model), copy.deepcopy(a_model)
runners = {"frozen": StaticRunner(a_model, capacity=512, device_path=DevicePath(False))}
regions_for = static_runner.regions_for
static_runner.regions_for = lambda model, regional: contextlib.nullcontext  # whole, weights as inputs
runners["unfrozen"] = StaticRunner(b_model, capacity=512, device_path=DevicePath(False))
c_model = copy.deepcopy(a_model)


class CppWrapperSettings:
    """`compile_units` builds its Inductor settings with `functools.partial(inductor_config.patch, {...})`
    when a runner makes its units: this shim adds the C++ wrapper to an unfrozen runner's settings."""

    @staticmethod
    def partial(fn, *args, **kwargs):
        if getattr(fn, "__name__", "") == "patch" and args and args[0].get("freezing") is False:
            args = ({**args[0], "cpp_wrapper": True}, *args[1:])
        return functools.partial(fn, *args, **kwargs)


compiled_units.functools = CppWrapperSettings
runners["unfrozen_cpp"] = StaticRunner(c_model, capacity=512, device_path=DevicePath(False))
runners["unfrozen_cpp"].reset(512)  # (its units' settings are made with its cache)
compiled_units.functools = functools
static_runner.regions_for = regions_for
eager = StaticRunner(e_model, capacity=512, compile=False)
vocab = a_model.config.vocab_size
prompt = torch.randint(0, vocab, (30,))
times = {(n, w): [] for n in runners for w in widths}


def timed_feed(runner: StaticRunner, width: int) -> tuple[torch.Tensor, float]:
    """One unit of `width` random tokens after the prompt, rolled back: its logits and seconds."""
    start = time.perf_counter()
    logits = runner.feed(torch.randint(0, vocab, (width,)), keep=width)[0]
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
    for w in widths:
        state = torch.random.get_rng_state()
        ref = timed_feed(eager, w)[0]
        for n, r in runners.items():
            torch.random.set_rng_state(state)  # the same tokens as the eager cache's
            out = timed_feed(r, w)[0]
            print(f"width {w} {n}: max |logit - eager| {(out - ref).abs().max().item():.2e}, argmax equal "
                  f"{bool((out.argmax(-1) == ref.argmax(-1)).all())}")
    for i in range(rounds):  # each round every width once per runner, the runners' order alternating
        for w in widths:
            for name in list(runners)[:: 1 if i % 2 == 0 else -1]:
                times[(name, w)].append(timed_feed(runners[name], w)[1])
medians = {k: sorted(v)[len(v) // 2] * 1000 for k, v in times.items()}
for name in ("unfrozen", "unfrozen_cpp"):
    ratios = [medians[(name, w)] / medians[("frozen", w)] for w in widths]
    for w, ratio in zip(widths, ratios, strict=True):
        print(f"width {w}: median frozen {medians[('frozen', w)]:.3f} ms, {name} {medians[(name, w)]:.3f} ms "
              f"(ratio {ratio:.3f}); fastest {min(times[('frozen', w)]) * 1000:.3f} / "
              f"{min(times[(name, w)]) * 1000:.3f} ms")
    print(f"geometric mean ratio {name}/frozen {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}")
