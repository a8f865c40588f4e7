"""Copy rounds in a batch: each row of a `BatchedDecoder` round copies its context where its suffix recurs.

The single-prompt decoder's copy rounds (`acchead.inference.copy_drafter`) decide per round; in a batch they
decide per row and per round. Before a round, every row whose committed tokens end in a suffix of at least
`min_match` tokens that occurred earlier in them takes the tokens that followed it (at most the
tokens it has left, less the round's bonus) as its candidates; the other rows draft under the policy as
they would without copying. The round's one draft pass serves the drafting rows (a copying row waits
masked, its cap 0: the draft's round start still feeds it the tokens its cache lacks), and the round's one
target forward verifies every row's candidates, copied or drafted, side by side.

Exact as one row alone: a copy is a deterministic function of the row's committed tokens, so its
candidates' draft law q is one-hot (`one_hot_laws`) and the verifier accepts candidate i with probability
p(x_i) under the row's own keys (seed_b, TAU/NEXT, n, 0), which are the single-prompt decoder's with seed_b:
a sampled row equals `SpeculativeDecoder(copy=...)`'s decode of its prompt alone, rounds included
(tests/test_batched_copy.py). A copy round does not move the row's policy state (AdaEDL's λ), as alone.

The round's verification is as wide as its widest row: a batch with one row copying 16 tokens verifies 17
positions on every row. On a GPU that width is nearly free; on a CPU the target's cost grows with the
positions fed, R rows x W, so a round over R rows copies at most `CopySpec.row_block(R)` = min(block,
max(2, batch // R)) tokens per row (batch = 16 by default: the single prompt's best block, its R·W kept;
on the CPU at B = 4 a cap of 4 beat 8 and 16, at B = 16 one of 2 beat 1, 4 and 16, docs/batched.md). R is
the rows still decoding, or on the fast path the batch's physical rows (finished rows stay as holes there,
computed all the same). A batch of one prompt runs on the single-prompt decoder, with `block`.
"""

from __future__ import annotations

import numpy as np
import torch

from acchead.inference.batched_rows import Row
from acchead.inference.copy_drafter import copy_continuation
from acchead.inference.drafter_spec import CopySpec
from acchead.sampling import SamplingConfig


def plan_copies(rows: list[Row], spec: CopySpec | None, paid: int) -> list[list[int]]:
    """Each row's copy round: the tokens it copies ([] where its suffix does not recur, no candidate fits
    before its last token, or the decoder copies nothing: `spec` None), read on the host from its ids, at
    most `spec.row_block(paid)` where the round's forward runs over `paid` rows."""
    if spec is None:
        return [[] for _ in rows]
    plans, most = [], spec.row_block(paid)
    for r in rows:
        room = min(most, r.max_new - r.generated - 1)  # the round's bonus token comes after
        plans.append(copy_continuation(np.asarray(r.ids, dtype=np.int64), spec.min_match, room) if room > 0
                     else [])  # fmt: skip
    return plans


def merge_copies(
    copies: list[list[int]], cands: list[list[int]], qs: list[torch.Tensor | None], vocab: int,
    sampling: SamplingConfig, device: torch.device,
) -> tuple[list[list[int]], list[torch.Tensor | None]]:  # fmt: skip
    """The round's candidates and draft laws per row: a copying row's copy with its one-hot q ((L, vocab);
    None under greedy decoding, which reads no q), the others' drafted candidates and q unchanged."""
    if not any(copies):  # no row copies this round (or the decoder never does): nothing to merge
        return cands, qs
    out_c, out_q = [], []
    for copy, c, q in zip(copies, cands, qs, strict=True):
        if copy:
            c, q = copy, None if sampling.greedy else one_hot_laws(copy, vocab, device)
        out_c.append(c)
        out_q.append(q)
    return out_c, out_q


def one_hot_laws(tokens: list[int], vocab: int, device: torch.device) -> torch.Tensor:
    """(L, vocab) float32: the draft law of each copied token, all its mass on it."""
    return torch.nn.functional.one_hot(torch.tensor(tokens, device=device), vocab).float()
