import sys, time, statistics
import torch
torch.set_num_threads(1)
import acchead.inference.round_verifier as rv
dense = len(sys.argv) > 1 and sys.argv[1] == "dense"
if dense:
    rv.VERIFY_WIDTHS = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64)
from acchead.pairs import resolve_pair, default_heads
from acchead.models import load_causal_lm, load_tokenizer
from acchead.sampling import SamplingConfig
from acchead.prompt_sources import load_prompts
from acchead.prompting import encode_prompt
from acchead.inference.decoder import SpeculativeDecoder
paths = resolve_pair("toy", None, None)
tok = load_tokenizer(paths.target)
target = load_causal_lm(paths.target, "float32", "cpu"); draft = load_causal_lm(paths.draft, "float32", "cpu")
heads = default_heads("toy", SamplingConfig(0.0))
prompts = [torch.tensor(encode_prompt(tok, p)) for p in load_prompts("humaneval", 12)]
L = max(p.numel() for p in prompts) + 128
specs = ["specdecpp:h=0.5,max=6", "autoregressive", "specdec:k=2", "specdec:k=3", "specdecpp:h=0.3,max=6", "specdecpp:h=0.7,max=6"]
decs = {}
t0 = time.perf_counter()
for spec in specs:
    t=time.perf_counter()
    d = SpeculativeDecoder(target, None if spec == "autoregressive" else draft, spec, head=heads[0] if "pp" in spec else None, fast=True)
    d.warm_up(L); print(spec, "warm %.1f" % (time.perf_counter()-t), flush=True); decs[spec]=d
print("warm total %.1f" % (time.perf_counter()-t0), flush=True)
rates = {s: [] for s in specs}; counts = {}
for rep in range(3):
    for spec, d in decs.items():
        n, s, dc, tc = 0, 0.0, 0, 0
        for p in prompts:
            r = d.generate(p, max_new_tokens=128, temperature=0); n += len(r.new_ids); s += r.wall_time; dc += r.draft_calls; tc += r.target_calls
        rates[spec].append(n / s); counts[spec] = (n, dc, tc)
    print(rep, {k: round(v[-1], 1) for k, v in rates.items()}, flush=True)
for spec in specs:
    print(f"{spec:28s} median {statistics.median(rates[spec]):7.1f} range {min(rates[spec]):.1f}-{max(rates[spec]):.1f} tokens/draft/target {counts[spec]}")
