"""A batch through transformers' `generate` (acchead.inference.hf_batched) against the same prompts one call
at a time, and against transformers' own batched greedy `generate`, side by side in one process.

    python docs/results/hf-batched-s43/hf_batched_probe.py --pair toy --batch-size 8 --max-new-tokens 64
    python docs/results/hf-batched-s43/hf_batched_probe.py --pair smollm2 \
        --head runs/demo-smollm2/head/head.safetensors

Greedy, the pair's shipped head for SpecDec++ (h from the head; batched under each batch rule: none,
c = 1 - h, c(B) measured, gated), fixed K = 3, 1 torch thread, eager. A measured rule's c(B) is timed in
its first call (the warm-up pass, untimed); the gated rule's memory carries over its calls (one cached
decoder). Every timed setting runs `--passes` times interleaved; the table holds each setting's median wall
seconds and tokens/s (tokens: the new tokens of every row, up to its EOS). Rows are checked against each
prompt's own greedy output alone.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from acchead.inference import hf, hf_decoders
from acchead.models import load_causal_lm, load_tokenizer
from acchead.pairs import default_heads, resolve_pair
from acchead.prompt_sets import load_prompt_set
from acchead.sampling import SamplingConfig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pair", default="toy")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--head", default=None, help="SpecDec++'s head (default: the pair's shipped greedy head)")
    args = p.parse_args()
    torch.set_num_threads(1)
    paths = resolve_pair(args.pair)
    target, draft = load_causal_lm(paths.target), load_causal_lm(paths.draft)
    tok = load_tokenizer(paths.target)
    head = args.head or default_heads(args.pair, SamplingConfig(0.0))[0]
    prompts = [str(x) for x in load_prompt_set("humaneval")[: args.batch_size]]
    tok.padding_side = "left"
    batch = tok(prompts, return_tensors="pt", padding=True)
    singles = [tok(x, return_tensors="pt") for x in prompts]
    n = args.max_new_tokens
    pad = tok.eos_token_id if tok.pad_token_id is None else tok.pad_token_id
    common = dict(max_new_tokens=n, do_sample=False, pad_token_id=pad)

    def new_tokens(rows: list[list[int]]) -> int:
        eos = tok.eos_token_id
        return sum(r.index(eos) + 1 if eos in r else len(r) for r in rows)

    def ours_batch(policy, rule=False):
        out = target.generate(**batch, draft=draft, head=head, policy=policy, custom_generate=hf.generate,
                              batch_stop=rule, **common)
        return [r[batch["input_ids"].shape[1]:].tolist() for r in out]

    def ours_single(policy):
        return [target.generate(**s, draft=draft, head=head, policy=policy, custom_generate=hf.generate,
                                **common)[0, s["input_ids"].shape[1]:].tolist() for s in singles]

    def hf_batch():
        out = target.generate(**batch, **common)
        return [r[batch["input_ids"].shape[1]:].tolist() for r in out]

    def hf_single():
        return [target.generate(**s, **common)[0, s["input_ids"].shape[1]:].tolist() for s in singles]

    settings = {
        "HF generate, one prompt at a time": hf_single,
        "HF generate, batched": hf_batch,
        "ours, SpecDec++, one prompt at a time": lambda: ours_single("specdecpp"),
        "ours, SpecDec++, batched (rows stop on their own)": lambda: ours_batch("specdecpp"),
        "ours, SpecDec++, batched, batch_stop=True (c = 1 - h)": lambda: ours_batch("specdecpp", True),
        "ours, SpecDec++, batched, batch_stop='measured'": lambda: ours_batch("specdecpp", "measured"),
        "ours, SpecDec++, batched, batch_stop='gated'": lambda: ours_batch("specdecpp", "gated"),
        "ours, K = 3, one prompt at a time": lambda: ours_single("specdec:k=3"),
        "ours, K = 3, batched": lambda: ours_batch("specdec:k=3"),
        "ours, AR, batched": lambda: ours_batch("autoregressive"),
    }
    reference = [r[: n] for r in hf_single()]

    def cut(rows):  # up to and including each row's EOS
        eos = tok.eos_token_id
        return [r[: r.index(eos) + 1] if eos in r else r for r in rows]

    times: dict[str, list[float]] = {k: [] for k in settings}
    outs = {}
    with torch.inference_mode():
        for name, fn in settings.items():  # warm-up pass (decoders built, caches allocated)
            outs[name] = fn()
        for _ in range(args.passes):
            for name, fn in settings.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    hf_decoders.DECODERS.clear()
    base = statistics.median(times["HF generate, one prompt at a time"])
    print(f"pair {args.pair}, B = {args.batch_size}, {n} new tokens, greedy, 1 thread, {args.passes} passes")
    print("| setting | median s | tokens/s | x HF one at a time | rows equal to each prompt's greedy alone |")
    print("|---|---|---|---|---|")
    for name in settings:
        t = statistics.median(times[name])
        exact = cut(outs[name]) == cut(reference)
        print(f"| {name} | {t:.2f} | {new_tokens(outs[name]) / t:.1f} | {base / t:.2f} | {exact} |")


if __name__ == "__main__":
    main()
