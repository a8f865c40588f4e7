"""The dense-widths probe of 2026-11-27 (docs/speed.md, issue 32 item 4): the toy pair on the CPU fast path,
verification graphs for every width 1-8 when run with `dense`, three interleaved timing rounds.

    python dense_widths_probe.py dense
"""

import statistics
import sys
import time

import torch

import acchead.inference.round_verifier as rv
from acchead.inference.decoder import SpeculativeDecoder
from acchead.models import load_causal_lm, load_tokenizer
from acchead.pairs import default_heads, resolve_pair
from acchead.prompt_sources import load_prompts
from acchead.prompting import encode_prompt
from acchead.sampling import SamplingConfig

SPECS = [
    "specdecpp:h=0.5,max=6",
    "autoregressive",
    "specdec:k=2",
    "specdec:k=3",
    "specdecpp:h=0.3,max=6",
    "specdecpp:h=0.7,max=6",
]


def main() -> None:
    torch.set_num_threads(1)
    if sys.argv[1:] == ["dense"]:
        rv.VERIFY_WIDTHS = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64)
    paths = resolve_pair("toy", None, None)
    tok = load_tokenizer(paths.target)
    target = load_causal_lm(paths.target, "float32", "cpu")
    draft = load_causal_lm(paths.draft, "float32", "cpu")
    head = default_heads("toy", SamplingConfig(0.0))[0]
    prompts = [torch.tensor(encode_prompt(tok, p)) for p in load_prompts("humaneval", 12)]
    length = max(p.numel() for p in prompts) + 128
    decoders = {}
    t0 = time.perf_counter()
    for spec in SPECS:
        t = time.perf_counter()
        drafter = None if spec == "autoregressive" else draft
        dec = SpeculativeDecoder(target, drafter, spec, head=head if "pp" in spec else None, fast=True)
        dec.warm_up(length)
        print(spec, f"warm {time.perf_counter() - t:.1f}", flush=True)
        decoders[spec] = dec
    print(f"warm total {time.perf_counter() - t0:.1f}", flush=True)
    rates: dict[str, list[float]] = {s: [] for s in SPECS}
    counts = {}
    for rep in range(3):
        for spec, dec in decoders.items():
            n, seconds, drafts, targets = 0, 0.0, 0, 0
            for p in prompts:
                r = dec.generate(p, max_new_tokens=128, temperature=0)
                n, seconds = n + len(r.new_ids), seconds + r.wall_time
                drafts, targets = drafts + r.draft_calls, targets + r.target_calls
            rates[spec].append(n / seconds)
            counts[spec] = (n, drafts, targets)
        print(rep, {k: round(v[-1], 1) for k, v in rates.items()}, flush=True)
    for spec in SPECS:
        r = rates[spec]
        print(f"{spec:28s} median {statistics.median(r):7.1f} range {min(r):.1f}-{max(r):.1f} "
              f"tokens/draft/target {counts[spec]}")  # fmt: skip


if __name__ == "__main__":
    main()
