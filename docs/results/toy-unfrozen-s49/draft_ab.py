"""A/B in one process, 1 thread: the real pair's feature draft (the shipped one) on the fast path, its
units compiled three ways,
  frozen: as the forty-seventh session's bench compiled a draft's units (Inductor's weight freezing and C++
          wrapper; never stored), forced here by `regional=False`;
  stored: the forty-eighth session's default, as a regional unit compiles (weights as inputs, Python
          wrapper) and so through the store of compiled units, loaded on a second run;
  stored_cpp: the same with Inductor's C++ wrapper (a whole unit calls no subgraph), stored too
          (the forty-ninth session's ../toy-unfrozen-s49/ab.py adds it the same way);
each unit's ready time, the logits against the eager static cache, then each width's step time (a draft
step feeds 1 pair; a round's first forward a ladder width), the runners alternating in order.
    TORCHINDUCTOR_CACHE_DIR=DIR python draft_ab.py WIDTHS ROUNDS
(the forty-eighth session's draft_ab.py with the third runner added)"""

import copy
import functools
import math
import sys
import time

import torch

from acchead.inference import compiled_units
from acchead.inference.device_path import DevicePath
from acchead.inference.static_runner import StaticRunner
from acchead.models import load_causal_lm
from acchead.pairs import pair_draft

widths, rounds = [int(w) for w in sys.argv[1].split(",")], int(sys.argv[2])
torch.set_num_threads(1)
a_model = load_causal_lm(pair_draft("smollm2"))
b_model, e_model = copy.deepcopy(a_model), copy.deepcopy(a_model)
runners = {"frozen": StaticRunner(a_model, capacity=512, device_path=DevicePath(False, regional=False))}
runners["stored"] = StaticRunner(b_model, capacity=512, device_path=DevicePath(False))
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
runners["stored_cpp"] = StaticRunner(c_model, capacity=512, device_path=DevicePath(False))
runners["stored_cpp"].reset(512)
compiled_units.functools = functools
eager = StaticRunner(e_model, capacity=512, compile=False)
width_of_state = a_model.state_width
prompt = torch.randint(0, 4000, (30,))
times = {(n, w): [] for n in runners for w in widths}


def timed_feed(runner: StaticRunner, width: int) -> tuple[torch.Tensor, float]:
    """One unit of `width` random (token, state) pairs after the prompt, rolled back: logits and seconds."""
    feats = torch.randn(width, width_of_state)
    start = time.perf_counter()
    logits = runner.feed(torch.randint(0, 4000, (width,)), keep=1, features=feats)[0]
    seconds = time.perf_counter() - start
    runner.rollback(len(prompt))
    return logits, seconds


prompt_states = torch.randn(len(prompt), width_of_state)
with torch.inference_mode():
    for name, r in [*runners.items(), ("eager", eager)]:
        r.reset(512)
        r.feed(prompt, features=prompt_states)
        for w in widths:
            seconds = timed_feed(r, w)[1]
            if name != "eager":
                print(f"{name} ready width {w}: {seconds:.2f} s", flush=True)
    for w in widths:
        state = torch.random.get_rng_state()
        ref = timed_feed(eager, w)[0]
        for n, r in runners.items():
            torch.random.set_rng_state(state)  # the same pairs as the eager cache's
            out = timed_feed(r, w)[0]
            kept = torch.isfinite(ref)  # the reduced vocabulary: -inf outside the draft's rows
            diff = (out[kept] - ref[kept]).abs().max().item()
            print(f"width {w} {n}: max |logit - eager| {diff:.2e} over its vocabulary, same -inf "
                  f"{bool((torch.isfinite(out) == kept).all())}, argmax equal "
                  f"{bool((out.argmax(-1) == ref.argmax(-1)).all())}")
    for i in range(rounds):  # each round every width once per runner, the runners' order alternating
        for w in widths:
            for name in list(runners)[:: 1 if i % 2 == 0 else -1]:
                times[(name, w)].append(timed_feed(runners[name], w)[1])
medians = {k: sorted(v)[len(v) // 2] * 1000 for k, v in times.items()}
for name in ("stored", "stored_cpp"):
    ratios = [medians[(name, w)] / medians[("frozen", w)] for w in widths]
    for w, ratio in zip(widths, ratios, strict=True):
        print(f"width {w}: median frozen {medians[('frozen', w)]:.3f} ms, {name} {medians[(name, w)]:.3f} ms "
              f"(ratio {ratio:.3f}); fastest {min(times[('frozen', w)]) * 1000:.3f} / "
              f"{min(times[(name, w)]) * 1000:.3f} ms")
    print(f"geometric mean ratio {name}/frozen {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}")
