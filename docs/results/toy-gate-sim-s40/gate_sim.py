"""The round gate's decodes at B = 4 on the toy pair, priced by the calibration's timed rounds instead of a
clock (fortieth session; docs/results/toy-gate-sim-s40/README.md). Not part of the package: a record of how
the figures were made, run from the repository root:

    .venv/bin/python docs/results/toy-gate-sim-s40/gate_sim.py VARIANT SCHEDULE

VARIANT: shipped (the package's gate: an exploring decode weighs its own rounds as any other, opening at the
policy's cap K if it is the first, else at 2c + 1 for the cap c the latest decode ran), ladder (the rule tried
at 538ec9e and reverted: an exploring decode drafts every round at its reach, c + 1, at least 2, the first's
2, and never weighs) or stay-dbl (as ladder, at the reach 2c + 1, the first's 3). SCHEDULE: reset (the first
decode of pass 0 is the gate's first, as in the bench) or continue (one decode of prompts 0-3 before pass 0,
which shifts the 2nd, 4th, 8th, ... decodes that explore onto other batches).

A decode's price is the sum over its rounds of the calibrated round price (`BatchCost.round_ratio` of its
draft forwards; an autoregressive round 1), in autoregressive rounds: the gate's choices given the
calibration are deterministic, so two variants compare without the clock's noise.
"""

import sys

import torch

from acchead.inference.batched import BatchedDecoder
from acchead.inference.round_gate import GateMemory, RoundGate
from acchead.models import load_causal_lm, load_tokenizer
from acchead.pairs import default_heads, resolve_pair
from acchead.prompt_sources import encode_prompts, load_prompts
from acchead.sampling import SamplingConfig

VARIANT, SCHEDULE = sys.argv[1], sys.argv[2]
B, NEW, PROMPTS = 4, 64, 64


class Memory(GateMemory):
    def start(self, rule, head, max_cap, rows=1, prefill=0.0):
        first, last = self.last_cap is None, self.last_cap
        gate = super().start(rule, head, max_cap, rows, prefill)
        if VARIANT == "shipped" or gate is None or gate.prior.gain is not None:
            return gate
        gate.explores = True  # read by the patched `cap` below
        c = 1 if first else last
        gate.open_cap = min(max_cap, max(2, c + 1 if VARIANT == "ladder" else 2 * c + 1))
        return gate


if VARIANT != "shipped":
    weighed_cap = RoundGate.cap

    def explored_cap(self, active):
        return self.open_cap if getattr(self, "explores", False) else weighed_cap(self, active)

    RoundGate.cap = explored_cap

torch.set_num_threads(1)
pair = resolve_pair("toy")
target, draft = load_causal_lm(pair.target, "float32", "cpu"), load_causal_lm(pair.draft, "float32", "cpu")
texts = load_prompts("humaneval", PROMPTS)
ids, _ = encode_prompts(texts, load_tokenizer(pair.target), target, draft, NEW, "cpu")
ids = [x[0] for x in ids]
head = default_heads("toy", SamplingConfig(0.0, 0, 1.0))[0]
length = max(len(x) for x in ids) + NEW
gated = BatchedDecoder(target, draft, "specdecpp:h=0.8,max=20", head=head, batch_stop="gated", fast=True)
gated.warm_up(B, length, 0.0)
gated._gates = Memory()
gated.generate(ids[:B], max_new_tokens=NEW, temperature=0.0)  # calibrates c(B)
if SCHEDULE == "reset":
    gated._gates = Memory()
cost = next(c for c in gated.batch_stop.costs.costs if c.batch == B)


def price(res) -> float:
    return sum(cost.round_ratio(f) if f > 0 else 1.0 for f in res.round_draft_calls)


fixed = BatchedDecoder(target, draft, policy="specdec:k=3", fast=True)
fixed.warm_up(B, length, 0.0)
k3 = sum(
    price(fixed.generate(ids[i : i + B], max_new_tokens=NEW, temperature=0.0))
    for i in range(0, PROMPTS, B)
)
passes = []
for _ in range(3):
    total, caps = 0.0, []
    for i in range(0, PROMPTS, B):
        res = gated.generate(ids[i : i + B], max_new_tokens=NEW, temperature=0.0)
        total += price(res)
        caps.append(f"{res.gate_cap}{'*' if res.gate_explored else ''}")
    passes.append(f"{total:.1f} ({k3 / total:.3f} K = 3) [{' '.join(caps)}]")
print(VARIANT, SCHEDULE, f"K = 3: {k3:.1f};", " | ".join(passes), flush=True)
