"""Stop rules of lockstep rounds at B = 4 on the toy pair, replayed offline beside the hindsight oracle
(forty-first session; docs/results/toy-batch-oracle-s41/README.md). Not part of the package: a record of how
the figures were made, run from the repository root after `batch_oracle.py measure`:

    .venv/bin/python docs/results/toy-batch-oracle-s41/rule_lab.py

Reads data.json (each row's run of draft agreement a(p) and the timed round prices ρ_K) and computes, per
row, the shipped lookahead head's P(accept) σ(p) of the draft's candidate at every position p of the
target's greedy output (one draft forward over prompt + output: in greedy decoding a draft that matched so
far sees exactly that prefix; a candidate after a round's first rejection is judged by the on-path σ, as
`acchead-headroom` does, optimistic for every rule alike). Then replays rounds of 4 rows in lockstep: every
unfinished row drafts candidate k = 1, 2, ... while its P̂ = Π σ stays ≥ 1 − h (the candidate that crossed is
verified, as the lookahead decoder does) and its cap allows; the batch stops drafting when the rows still
drafting expect Σ P̂ ≤ bound_k (the measured rule: c(B)·R; priced: (ρ_{k+1} − ρ_k)·R, the timed price of
one more candidate); each row gains min(a(p), its candidates) + 1; a round costs ρ of its draft forwards.
"""

import numpy as np
import torch
from batch_oracle import KMAX, NEW, PROMPTS, B, load_toy, read_data  # this folder's

from acchead.head_io import load_head
from acchead.lookahead import lookahead_inputs
from acchead.models import output_embedding_table
from acchead.pairs import default_heads
from acchead.sampling import SamplingConfig


def head_probs() -> list[np.ndarray]:
    """σ(p) per row: the head's P(accept) of the draft's greedy candidate at each output position."""
    target, draft, tok, ids = load_toy()
    sampling = SamplingConfig(0.0, 0, 1.0)
    head, _ = load_head(default_heads("toy", sampling)[0], draft=draft)
    out_emb = output_embedding_table(draft)
    agree, sigma = [], []
    with torch.no_grad():
        for prompt in ids:
            eos = tok.eos_token_id
            out = target.generate(prompt[None], max_new_tokens=NEW, do_sample=False, eos_token_id=eos,
                                  pad_token_id=eos)[0, len(prompt) :]  # fmt: skip
            seq = torch.cat([prompt, out])[None]
            res = draft(seq, output_hidden_states=True)
            n = len(out)
            logits = res.logits[0, len(prompt) - 1 : -1]  # (N, V): q at each output position
            state = res.hidden_states[-1][0, len(prompt) - 1 : -1]  # (N, H)
            guess = logits.argmax(-1)
            x = lookahead_inputs(head.inputs, state, guess, out_emb, sampling, logits)
            sigma.append(torch.sigmoid(head(x).squeeze(-1)).double().numpy())
            run, a = 0, []
            for hit in reversed((guess == out).tolist()):
                run = run + 1 if hit else 0
                a.append(run)
            agree.append(a[::-1])
            assert len(sigma[-1]) == n
    return agree, sigma


def replay(rows, sig, rho, cap: int, h: float, bounds, lockstep: bool = False) -> float:
    """A batch's price in AR rounds under the rule (bounds[k]: the batch bound per row after candidate k).
    `lockstep`: a row whose own P̂ fell below 1 − h keeps drafting while the batch drafts (its candidates
    cost nothing more: the forward and the padded verification are the batch's); the batch stops once no
    row's own rule would go on, or by the batch rule over every row in the round."""
    pos, price = [0] * len(rows), 0.0
    while True:
        live = [b for b, (p, a) in enumerate(zip(pos, rows, strict=True)) if p < len(a)]
        if not live:
            return price
        log_p = {b: 0.0 for b in live}
        drafting = {b for b in live if min(cap, len(rows[b]) - pos[b] - 1) > 0}
        willing = set(drafting)
        taken = dict.fromkeys(live, 0)
        forwards = 0
        k = 0
        while drafting:
            k += 1
            forwards = k
            for b in list(drafting):
                taken[b] = k
                row_cap = min(cap, len(rows[b]) - pos[b] - 1)
                if k >= row_cap:  # the candidate reaches the row's cap: not judged, the row stops
                    drafting.discard(b)
                    willing.discard(b)
                    continue
                log_p[b] += np.log(max(sig[b][pos[b] + k - 1], 1e-300))
                if h < 1.0 and log_p[b] < np.log1p(-h):
                    willing.discard(b)
                    if not lockstep:
                        drafting.discard(b)
            if not willing or sum(np.exp(log_p[b]) for b in drafting) <= bounds[k] * len(live):
                drafting = set()
        step = rho[KMAX] - rho[KMAX - 1]  # past the timed rounds, by the last timed step
        price += rho[forwards] if forwards <= KMAX else rho[KMAX] + (forwards - KMAX) * step
        for b in live:
            pos[b] = min(pos[b] + min(rows[b][pos[b]], taken[b]) + 1, len(rows[b]))


def main() -> None:
    data = read_data()
    dec = data["decoders"]
    agree, sigma = head_probs()
    assert agree == data["agree"], "the eager greedy outputs differ from the fast path's"
    rows = [np.array(a) for a in agree]
    ar = dec["AR"]["round_s"]
    rho = np.array([1.0] + [dec[f"K={k}"]["round_s"] / ar for k in range(1, KMAX + 1)])
    c = (rho[3] - rho[1]) / 2  # the calibration's slope over rounds of 1-3 forwards
    marginal = [0.0] + [rho[k + 1] - rho[k] for k in range(KMAX)] + [rho[KMAX] - rho[KMAX - 1]] * 20
    batches = [(rows[i : i + B], sigma[i : i + B]) for i in range(0, PROMPTS, B)]
    k3 = sum(replay(r, s, rho, 3, 1.0, [-1.0] * 30) for r, s in batches)
    print(f"K = 3 replayed: {k3:.1f} AR rounds; c = {c:.3f}")
    for cap in (2, 3, 4, 6, 20):
        for h in (0.5, 0.7, 0.8, 0.9, 1.0):  # 1.0: rows never stop on their own
            line = []
            for name, bounds in (("no batch rule", [-1.0] * 30), ("measured c", [c] * 30),
                                 ("priced", marginal)):  # fmt: skip
                for lockstep in (False, True):
                    price = sum(replay(r, s, rho, cap, h, bounds, lockstep) for r, s in batches)
                    line.append(f"{name}{' lockstep' if lockstep else ''} {k3 / price:.3f}")
            print(f"cap {cap:2d} h {h}: " + ", ".join(line), "(x K = 3's rounds)")


if __name__ == "__main__":
    main()
