"""One batched draft step as tensor ops: what `BatchedDecoder` does with a draft forward's output, for every
row at once, with no host read (the batched twin of `acchead.inference.units.draft_post`).

After each draft forward of a round, every row draws its candidate Y_k from q_k, and the round's stop rules
decide which rows draft on: the row's cap, a draft-only rule (confidence, entropy, AdaEDL), SpecDec++'s
threshold on the row's P̂ (`log P̂ < log(1 − h)`) and the batch rule (`acchead.inference.batch_stop`).
`draft_step` computes all of it over the whole batch: the head runs on every row and a row that is not
judged keeps its P̂ (`torch.where`, not a gather of the judged rows, so the shapes never depend on the
values). The host then reads one flag per step, whether any row still drafts.

On the batched fast path the function is traced into the draft forward's own compiled graph
(`StaticRaggedCache.feed(..., post=...)`, as `StaticRunner` does for one row); the eager path and the fast
path's CPU twin call it as it is. The threshold and the batch rule's c(B)·B are 0-d tensors, so every
threshold and batch size shares one graph per shape.

The step's order is the eager loop's (DESIGN §4):

- `SAMPLE` rules (a lookahead head, the draft-only rules, none) judge the candidate drawn here, from the
  state that produced q_k: a row takes Y_k if it was drafting, then stops if its rule fires or Y_k reaches
  its cap; then the batch rule may stop every row.
- `FEED` (the paper's candidate head) judges the candidate this forward fed, Y_{k-1}, from the hidden
  state after it (from k = 2 on): a row whose P̂ falls below the threshold stops, and takes Y_k, whose q
  this forward made, as its free token; the batch rule, over the rows still drafting, may stop them all.

With a batch rule the rounds are one decision of the batch (`StepRule.lockstep`): a row whose own P̂ fell
below the threshold is a vote to stop, not a stop. It drafts on while the batch does, since its candidates
cost nothing more (the draft forward runs over every row and the verification is padded to the longest
row), and the batch stops once no row's own rule would go on or the batch rule, over every row in the
round, says so. Replayed offline on the toy pair at B = 4, rows that stopped alone gave up 4-13% of the
batch's price at every cap (docs/results/toy-batch-oracle-s41). Without a batch rule each row stops
alone, as it would decoded on its own.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from acchead.head import AcceptanceHead
from acchead.inference.batch_stop import expected_gain, row_rule_flags
from acchead.inference.batched_feed import TokenFeed
from acchead.inference.device_random import DRAFT, key_hash, sample_token
from acchead.inference.policies import StopPolicy
from acchead.inference.ragged_cache import Post
from acchead.inference.results import BatchResult
from acchead.inference.units import FEED, SAMPLE
from acchead.lookahead import lookahead_inputs
from acchead.sampling import SamplingConfig, probs_from_logits


@dataclass(frozen=True)
class StepRule:
    """What a decoder's draft steps decide with: constants of the step's graph (equal rules share graphs).

    Attributes:
        judge_at: `SAMPLE` or `FEED` (module docstring).
        head: SpecDec++'s acceptance head, or None (fixed K, the draft-only rules).
        row_policy: a draft-only rule (`Confidence`, `Entropy`, `AdaEDL`) judged per row, or None.
        free: a `FEED` stop takes the free token Y_k.
        lockstep: a row's own threshold is a vote and the batch stops as one (module docstring); the
            decoder sets it with a batch rule.
        out_emb: (V, H) the draft's output embedding, for a lookahead head reading "token" (not compared).
    """

    judge_at: str = SAMPLE
    head: AcceptanceHead | None = None
    row_policy: StopPolicy | None = None
    free: bool = True
    lockstep: bool = False
    out_emb: torch.Tensor | None = field(default=None, compare=False, hash=False)


def draft_step(
    logits: torch.Tensor,
    hidden: torch.Tensor | None,
    model: torch.nn.Module,
    cache: object,
    drafting: torch.Tensor,
    log_p: torch.Tensor,
    cap: torch.Tensor,
    seeds: torch.Tensor,
    starts: torch.Tensor,
    lams: torch.Tensor | None,
    k: torch.Tensor,
    log_keep: torch.Tensor,
    batch_bound: torch.Tensor,
    rule: StepRule,
    sampling: SamplingConfig,
) -> tuple[torch.Tensor, ...]:
    """A draft step after its forward (the signature of a `feed(..., post=...)`: logits, hidden, model,
    cache, then the per-row tensors, then the constants).

    Args:
        logits: (B, 1, V) the draft's logits after each row's last fed token (q_k's).
        hidden: (B, 1, H) the final hidden states there, or None (no rule reads them).
        model, cache: the forward's (unused).
        drafting: (B,) bool, the rows that fed this forward's candidate (k = 1: the rows with cap > 0).
        log_p: (B,) float64, each row's log P̂ of the round so far.
        cap: (B,) int64, each row's candidate cap this round.
        seeds, starts: (B,) int64, each row's seed and round start (its committed length): the draw keys.
        lams: (B,) float64 each row's AdaEDL λ, or None.
        k: 0-d int64, the candidate's index in its round (1-based).
        log_keep: 0-d float64, log(1 − h): a row stops when its log P̂ falls below it.
        batch_bound: 0-d float64, the batch rule's c(R)·R over the R rows decoding; −1: no batch rule.
        rule, sampling: the decoder's `StepRule` and S.
    Returns:
        y (B,) int64 the candidates; q (B, V) float32 their distributions; take (B,) bool, the rows whose
        round takes y; drafting (B,) bool, the rows that feed y and draft on; log_p (B,); the batch rule's
        flag (0-d bool: it stopped the batch at this step); hidden (B, H) or None; the head's count of
        judged candidates (0-d int64).
    """
    row = logits[:, -1]  # (B, V)
    state = hidden[:, -1] if hidden is not None else None  # (B, H)
    q = probs_from_logits(row, sampling)
    y = sample_token(q, sampling.greedy, 0 if sampling.greedy else key_hash(seeds, DRAFT, starts, k))
    no_rule = torch.zeros((), dtype=torch.bool, device=row.device)
    judged_count = torch.zeros((), dtype=torch.int64, device=row.device)
    within = k < cap  # (B,) the candidate does not reach the row's cap: it is judged
    head = rule.head
    if rule.judge_at == FEED:
        batch_stop = no_rule
        if head is not None:
            assert state is not None, "a candidate head reads the hidden state after the fed candidate"
            fed = drafting & (k > 1)  # the start forward fed committed tokens, nothing to judge
            log_p = torch.where(fed, log_p + F.logsigmoid(head(state).double()), log_p)
            stop, batch_stop = _stops(fed, log_p, log_keep, batch_bound, rule.lockstep)
            take = drafting if rule.free else drafting & ~stop
            drafting = drafting & ~stop
            judged_count = fed.sum()
        else:
            take = drafting
        return y, q, take, drafting & within, log_p, batch_stop, state, judged_count
    take = drafting
    judged = drafting & within
    if rule.row_policy is not None:
        flags = row_rule_flags(rule.row_policy, q, row, y, sampling.greedy, lams)
        drafting = drafting & ~(judged & flags)
    batch_stop = no_rule
    if head is not None:
        assert state is not None, "a lookahead head reads the state that produced q"
        x = lookahead_inputs(head.inputs, state, y, rule.out_emb, sampling, row)
        log_p = torch.where(judged, log_p + F.logsigmoid(head(x).double()), log_p)
        judged_count = judged.sum()
    drafting = drafting & within
    if head is not None:
        stop, batch_stop = _stops(drafting, log_p, log_keep, batch_bound, rule.lockstep)
        drafting = drafting & ~stop
    return y, q, take, drafting, log_p, batch_stop, state, judged_count


def _stops(
    rows: torch.Tensor, log_p: torch.Tensor, log_keep: torch.Tensor, bound: torch.Tensor, lockstep: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Which of `rows` ((B,) bool, the rows just judged) stop drafting, and the batch rule's flag (0-d).

    Apart: a row stops once its P̂ falls below its threshold, then the batch rule, over the rows left, may
    stop them all. `lockstep` (module docstring): the rows stop together, once none is above its threshold
    or by the batch rule over every one of them."""
    below = rows & (log_p < log_keep)
    if lockstep:
        go_on = (rows & ~below).any()  # some row's own rule would draft on
        batch_stop = go_on & (expected_gain(log_p, rows) <= bound)
        return rows & (batch_stop | ~go_on), batch_stop
    rest = rows & ~below
    batch_stop = rest.any() & (expected_gain(log_p, rest) <= bound)
    return torch.where(batch_stop, rows, below), batch_stop



class StepIndex:
    """k as a 0-d int64 tensor (a graph input, not a constant), one per value, made once per decoder."""

    def __init__(self) -> None:
        self._ks: list[torch.Tensor] = []

    def __call__(self, k: int, device: torch.device) -> torch.Tensor:
        while len(self._ks) <= k:
            self._ks.append(torch.tensor(len(self._ks), device=device))
        return self._ks[k]


def step_posts(
    caps: list[int], seeds: list[int], starts: list[int], lams: list[float] | None, h: float | None,
    bound: float, rule: StepRule, sampling: SamplingConfig, dev: torch.device, index: StepIndex,
) -> Callable[..., Post]:  # fmt: skip
    """A round's draft steps for rows of these caps, seeds, starts (committed lengths), AdaEDL λs, SpecDec++
    threshold h (None: no head) and batch-rule bound (−1: none): `post(k, drafting, log_p)` is the `feed`
    post of candidate k (`draft_step`'s per-row state from the step before; k = 1: the rows with cap > 0,
    log P̂ = 0)."""
    tensor = functools.partial(torch.tensor, device=dev)
    cap_t = tensor(caps)
    f64 = functools.partial(tensor, dtype=torch.float64)
    rest = (cap_t, tensor(seeds), tensor(starts), None if lams is None else f64(lams))
    constants = (f64(math.log1p(-h) if h is not None else 0.0), f64(bound), rule, sampling)
    first = (cap_t > 0, torch.zeros(len(caps), dtype=torch.float64, device=dev))

    def post(k: int, drafting: torch.Tensor | None = None, log_p: torch.Tensor | None = None) -> Post:
        now = first if drafting is None else (drafting, log_p)
        return draft_step, (*now, *rest), (index(k, dev), *constants)

    return post


def run_draft_steps(
    feed: TokenFeed, ids: list[list[int]], want: bool, post: Callable[..., Post], catch_up: int | None,
    out: BatchResult,
) -> tuple[list[list[int]], list[torch.Tensor | None]]:  # fmt: skip
    """A round's draft forwards for rows of committed `ids`, each running `post`'s step in its own unit (the
    host reads one flag per step, whether any row drafts on, and the candidates once): ([candidates of row
    b], [(L_b, V) their q or None]); `out` counts the forwards, batch stops and head calls. `want`: a head
    reads each step's state; `catch_up`: `TokenFeed.start`'s widest compiled start."""
    steps = [feed.start(ids, want, post(1), catch_up)]
    while True:
        y, _, _, drafting, log_p, _, state, _ = steps[-1]
        if not bool(drafting.any()):  # the step's one host read
            break
        steps.append(feed.step(y, drafting, state, want, post(len(steps) + 1, drafting, log_p)))
    out.draft_calls += len(steps)
    ys, qs, takes, _, _, stops, _, judged = zip(*steps, strict=True)
    counts = torch.stack(takes).sum(0)  # (R,) a row's candidates: its steps' takes are a prefix
    tally = torch.stack([torch.stack(stops).sum(), torch.stack(judged).sum()]).tolist()
    out.batch_stops += int(tally[0])
    out.head_calls += int(tally[1])
    q_all = torch.stack(qs)  # (S, R, V)
    cands = [c[:n] for c, n in zip(torch.stack(ys).T.tolist(), counts.tolist(), strict=True)]
    return cands, [q_all[: len(c), b] if c else None for b, c in enumerate(cands)]
