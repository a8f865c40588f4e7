"""The hindsight oracle of lockstep rounds at B = 4 on the toy pair: how far can any stop rule get above the
best fixed K (forty-first session; docs/results/toy-batch-oracle-s41/README.md). Not part of the package: a
record of how the figures were made, run from the repository root:

    .venv/bin/python docs/results/toy-batch-oracle-s41/batch_oracle.py measure [REPEATS]  # writes data.json
    .venv/bin/python docs/results/toy-batch-oracle-s41/batch_oracle.py solve  # reads it

1. Times, in one process, batched autoregressive decoding, fixed K = 1..KMAX and gated SpecDec++ (the bench's
   `specdecpp:h=0.8,max=20`, lookahead head, `--batch-stop gated`) on the batched fast path, B = 4, HumanEval
   prompts 0-63, 64 greedy tokens, EOS as the bench, interleaved REPEATS times. A round of K costs ρ_K
   autoregressive rounds: the mean of the fixed-K decodes' per-round wall seconds (`round_times`, the first
   round's prefill left out) over AR's.
2. Reads, per row, the draft's greedy agreement with the target's greedy output: in greedy decoding a draft
   that matched so far sees exactly the target's prefix, so one draft forward over prompt + output gives, for
   every position p, a(p) = how many of the next candidates a round opened at p would accept. A round of K
   then moves a row from p to min(p + min(a(p), K) + 1, its length); the model's rounds for every fixed K are
   checked against the decodes' own counts.
3. Solves, per batch of 4, the cheapest sequence of lockstep rounds (each round one K in 0..KMAX for every
   row, K = 0 an autoregressive round) that finishes all four rows, by dynamic programming over the rows'
   positions (a (L0+1, ..., L3+1) array solved by the positions' sum), in hindsight: no stop rule of
   lockstep rounds can beat it under these prices. With KMAX = 3..6, and with the path it takes (its Ks).
"""

import json
import sys
import time
from pathlib import Path

import numpy as np

DATA = Path(__file__).with_name("data.json")
B, NEW, PROMPTS, KMAX = 4, 64, 64, 6


def load_toy() -> tuple:
    """The toy pair (float32, 1 thread), its tokenizer and the prompts' ids ((T,) each)."""
    import torch

    from acchead.models import load_causal_lm, load_tokenizer
    from acchead.pairs import resolve_pair
    from acchead.prompt_sources import encode_prompts, load_prompts

    torch.set_num_threads(1)
    pair = resolve_pair("toy")
    target = load_causal_lm(pair.target, "float32", "cpu")
    draft = load_causal_lm(pair.draft, "float32", "cpu")
    tok = load_tokenizer(pair.target)
    ids, _ = encode_prompts(load_prompts("humaneval", PROMPTS), tok, target, draft, NEW, "cpu")
    return target, draft, tok, [x[0] for x in ids]


def measure(repeats: int) -> None:
    import torch

    from acchead.inference.batched import BatchedDecoder
    from acchead.pairs import default_heads
    from acchead.sampling import SamplingConfig

    target, draft, tok, ids = load_toy()
    length = max(len(x) for x in ids) + NEW
    head = default_heads("toy", SamplingConfig(0.0, 0, 1.0))[0]
    specs = {"AR": "autoregressive", **{f"K={k}": f"specdec:k={k}" for k in range(1, KMAX + 1)}}
    decoders = {name: BatchedDecoder(target, draft, spec, fast=True) for name, spec in specs.items()}
    decoders["gated"] = BatchedDecoder(target, draft, "specdecpp:h=0.8,max=20", head=head,
                                       batch_stop="gated", fast=True)  # fmt: skip
    start = time.perf_counter()
    for dec in decoders.values():
        dec.warm_up(B, length, 0.0)
    print(f"warm-up {time.perf_counter() - start:.0f} s", flush=True)
    batches = [ids[i : i + B] for i in range(0, PROMPTS, B)]
    runs: dict[str, list] = {name: [] for name in decoders}  # name -> per repeat, per batch: BatchResult
    for rep in range(repeats):
        for name, dec in decoders.items():
            runs[name].append([dec.generate(b, max_new_tokens=NEW, temperature=0.0,
                                            eos_token_id=tok.eos_token_id) for b in batches])  # fmt: skip
            wall = sum(r.wall_time for r in runs[name][-1])
            print(f"repeat {rep} {name}: {wall:.2f} s, {sum(r.target_calls for r in runs[name][-1])} rounds,"
                  f" caps {[r.gate_cap for r in runs[name][-1]] if name == 'gated' else '-'}",
                  flush=True)  # fmt: skip
    outputs = [row.new_ids for res in runs["AR"][0] for row in res.rows]
    for name, reps in runs.items():
        for batch_results in reps:
            got = [row.new_ids for res in batch_results for row in res.rows]
            assert all(torch.equal(a, b) for a, b in zip(outputs, got, strict=True)), f"{name} differs"
    agree = []  # a(p) per row: the draft's greedy run of agreement with the output from position p on
    with torch.no_grad():
        for prompt, out in zip(ids, outputs, strict=True):
            seq = torch.cat([prompt, out])[None]
            guess = draft(seq).logits[0, len(prompt) - 1 : -1].argmax(-1)  # (N,): the draft's token at p
            run, a = 0, []
            for hit in reversed((guess == out).tolist()):
                run = run + 1 if hit else 0
                a.append(run)
            agree.append(a[::-1])
    data = {
        name: {
            "wall_s": [sum(r.wall_time for r in reps) for reps in runs[name]],
            "rounds": [sum(r.target_calls for r in reps) for reps in runs[name]],
            # mean seconds of a round after a decode's first (which holds the prefill)
            "round_s": float(np.mean([t for reps in runs[name] for r in reps for t in r.round_times[1:]])),
            "caps": [[r.gate_cap for r in reps] for reps in runs[name]] if name == "gated" else None,
        }
        for name in runs
    }
    tmp = DATA.with_suffix(".tmp")
    tmp.write_text(json.dumps({"tokens": sum(len(o) for o in outputs), "agree": agree, "decoders": data}))
    tmp.replace(DATA)


def advance(a: np.ndarray, k: int) -> np.ndarray:
    """(L+1,) a row's next position from each position p in 0..L after a round of K (L: finished)."""
    n = len(a)
    return np.append(np.minimum(np.arange(n) + np.minimum(a, k) + 1, n), n)


def fixed_rounds(rows: list[np.ndarray], k: int) -> int:
    pos, rounds = [0] * len(rows), 0
    while any(p < len(a) for p, a in zip(pos, rows, strict=True)):
        pos = [advance(a, k)[p] for p, a in zip(pos, rows, strict=True)]
        rounds += 1
    return rounds


def oracle(rows: list[np.ndarray], rho: np.ndarray) -> tuple[float, list[int]]:
    """The cheapest lockstep schedule's price (AR rounds) and its rounds' Ks. A round moves every unfinished
    row forward, so the sum of the positions grows: states are solved by that sum, from the finished end."""
    ks = len(rho)
    shape = tuple(len(a) + 1 for a in rows)
    strides = [int(np.prod(shape[i + 1 :])) for i in range(len(shape))]
    views = [[shape[i] if j == i else 1 for j in range(len(shape))] for i in range(len(shape))]
    flat_next = np.stack([  # (ks, S): the flat index of the state after a round of K, from every state
        sum((advance(a, k) * s).reshape(v) for a, s, v in zip(rows, strides, views, strict=True)).ravel()
        for k in range(ks)
    ])
    level = sum(np.arange(n).reshape(v) for n, v in zip(shape, views, strict=True)).ravel()
    order = np.argsort(-level, kind="stable")
    bounds = np.flatnonzero(np.diff(level[order])) + 1
    value, choice = np.zeros(len(level)), np.zeros(len(level), dtype=np.int64)
    for idx in np.split(order, bounds)[1:]:  # the first group is the finished state alone: 0
        cand = rho[:, None] + value[flat_next[:, idx]]  # (ks, n)
        choice[idx] = cand.argmin(0)
        value[idx] = cand.min(0)
    path, state = [], 0
    while state != len(level) - 1:
        path.append(int(choice[state]))
        state = int(flat_next[choice[state], state])
    return float(value[0]), path


def solve() -> None:
    data = read_data()
    dec, tokens = data["decoders"], data["tokens"]
    agree = [np.minimum(np.array(a, dtype=np.int64), KMAX) for a in data["agree"]]
    ar_round = dec["AR"]["round_s"]
    rho = np.array([1.0] + [dec[f"K={k}"]["round_s"] / ar_round for k in range(1, KMAX + 1)])
    print("rho_K (a round of K over an autoregressive one):", " ".join(f"{k}:{r:.3f}" for k, r in
          enumerate(rho)), f"| AR round {ar_round * 1e3:.2f} ms")  # fmt: skip
    batches = [agree[i : i + B] for i in range(0, PROMPTS, B)]
    for k in range(KMAX + 1):
        name = "AR" if k == 0 else f"K={k}"
        model = sum(fixed_rounds(rows, k) for rows in batches)
        print(f"{name}: model rounds {model}, decoded {dec[name]['rounds']},"
              f" {tokens / np.mean(dec[name]['wall_s']):.1f} tokens/s")  # fmt: skip
    print(f"gated: rounds {dec['gated']['rounds']}, {tokens / np.mean(dec['gated']['wall_s']):.1f} tokens/s,"
          f" caps {dec['gated']['caps']}")  # fmt: skip
    best = min((f"K={k}" for k in range(1, KMAX + 1)), key=lambda n: np.mean(dec[n]["wall_s"]))
    kb = int(best[2:])
    best_wall = float(np.mean(dec[best]["wall_s"]))
    best_price = sum(fixed_rounds(rows, kb) for rows in batches) * rho[kb]
    print(f"best fixed K: {best}, its rounds priced at {best_price:.1f} AR rounds")
    for kmax in range(3, KMAX + 1):
        price, ks = 0.0, []
        for rows in batches:
            p, path = oracle([np.minimum(a, kmax) for a in rows], rho[: kmax + 1])
            price, ks = price + p, ks + path
        # the oracle's decode: the best K's wall with its rounds' price swapped for the oracle's
        wall = best_wall + (price - best_price) * ar_round
        hist = " ".join(f"{k}:{ks.count(k)}" for k in range(kmax + 1))
        print(f"oracle, K <= {kmax}: {price:.1f} AR rounds ({best_price / price:.3f}x the best K's rounds),"
              f" {len(ks)} rounds (Ks {hist}); {tokens / wall:.1f} tokens/s, {best_wall / wall:.3f}x the"
              f" best K's wall, gated {best_wall / np.mean(dec['gated']['wall_s']):.3f}x")  # fmt: skip


def read_data() -> dict:
    """data.json, or a one-line exit naming the command that writes it."""
    if not DATA.is_file():
        sys.exit(f"{DATA} is missing: run batch_oracle.py measure first")
    return json.loads(DATA.read_text())


if __name__ == "__main__":
    if sys.argv[1:2] not in (["measure"], ["solve"]) or (sys.argv[2:] and not sys.argv[2].isdigit()):
        sys.exit("usage: batch_oracle.py measure [REPEATS] | solve")
    if sys.argv[1] == "measure":
        measure(int(sys.argv[2]) if len(sys.argv) > 2 else 2)
    solve()
