"""SpecDec++'s stop rule (paper Algorithm 2), and its threshold priced by the measured verification widths.

The paper's cost model (DESIGN §4) charges a round c·N_draft + N_target: a verification costs the same
whatever its width, so one more candidate costs one draft step, c target steps, and the rule that follows
from it (Theorem 3.1) stops once P̂ = Π_j σ(f_j), the probability that every candidate so far is accepted,
falls below 1 − h. On a GPU that holds: a small target's verification is memory-bound. On a CPU it does
not: the fast path verifies at a few padded widths (`acchead.inference.round_verifier`), and SmolLM2's
units took 55 / 64 / 82 ms at widths 1 / 4 / 8 on the 2-core box, flat within a width and a step between
them. A candidate that moves the round into the next width then costs its draft step plus that step.

`priced=1` adds it. With V(f) the measured milliseconds of the unit that verifies f fed tokens (the
cheapest width the verifier runs f at, timed by `RoundVerifier.warm_up`) and V(1) an autoregressive step,
continuing after the k-th candidate costs, in autoregressive steps,

    c_k = (1 − h) + (V(f_k + 1) − V(f_k)) / V(1),

where f_k is what a stop at k verifies (k + 1 tokens; k + 2 with a candidate head's free token), and the
rule stops once P̂ < c_k (c_k ≤ 0: never). Within a width c_k = 1 − h, the paper's rule; at a step up c_k
rises by its price, so the round stops before a dearer width unless the head is confident enough to fill
it. The rule is myopic, one candidate ahead, as the paper's is. The thresholds are a (max_draft + 2,) table
on the head's device, read in the draft's compiled step by a gather at the round's judged count (kept in
the rule's stats beside log P̂): one graph serves every threshold, priced or not. Priced thresholds come
from a timing, so two processes may stop rounds differently; every output stays an exact sample of the
target (the rule reads only the drafted prefix). Without a warm-up's timings (the eager path) a priced
policy runs the paper's rule.
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F

from acchead.head import AcceptanceHead
from acchead.inference.drafters import DraftStep
from acchead.inference.head_call import HeadCall
from acchead.inference.policies import PolicyRun, StopPolicy
from acchead.inference.policy_spec import DEFAULT_MAX_DRAFT, SpecDecPPSpec
from acchead.inference.units import FEED, SAMPLE


def priced_thresholds(h: float, fed_ms: dict[int, float], cap: int, extra: int) -> list[float]:
    """c_0..c_{cap+1} of the module docstring: c_k prices continuing after the k-th judged candidate.

    Args:
        h: the rule's threshold (the draft step's price is 1 − h autoregressive steps).
        fed_ms: measured ms of the verification of f fed tokens, f = 1.. (every f a decode can verify).
        cap: the most candidates a round drafts.
        extra: tokens a stop at k verifies beyond k: 1 (the committed token), 2 with a free token.
    Returns:
        cap + 2 thresholds; 1 − h where a cost is missing (index 0, or f past the timed widths).
    """
    base = 1.0 - h
    out = [base] * (cap + 2)
    unit = fed_ms.get(1)
    if not unit or unit <= 0:
        return out
    for k in range(1, cap + 2):
        now, more = fed_ms.get(k + extra), fed_ms.get(k + extra + 1)
        if now is not None and more is not None:
            out[k] = base + (more - now) / unit
    return out


class SpecDecPP(StopPolicy):
    """SpecDec++ (paper Algorithm 2): stop when `1 - Π_j σ(f_j) > h` (or, `priced`, when Π_j σ(f_j) falls
    below the round's priced threshold: module docstring), or at `max_draft` candidates.

    With a `candidate` head (the paper's) f_j = f(e_j) reads the state after candidate Y_j was fed, so the
    drafter feeds each judged candidate at once and the first decision needs two draft forwards; on a stop
    the next candidate, whose q the last forward produced, is appended unjudged when `free`. With a
    `lookahead` head (DESIGN §3.1) f_j = f(s_{j-1}, Y_j) reads the state that produced q_j (plus the
    candidate's log q, entropy or output-embedding row, as the head was trained), right after Y_j is
    sampled: a stop verifies Y_1..Y_j, every verified candidate was judged, and no forward is spent on
    a candidate before it is judged, so a round can end after one draft forward. No free token then.

    The product P̂ is kept as a log (sum of log-sigmoids, float64, on the head's device), so long rounds
    never underflow, and the stop test is `log P̂ < log c_k`: one host read per judged candidate. The
    rule's stats are (2,) float64: [log P̂, judged candidates k]. The head runs once per candidate through
    `HeadCall`, which keeps its per-call overhead to a few kernels and equals `head(x)` (pinned by tests).
    """

    # `judge` reads the thresholds from `_log_keep`: every h, priced or not, shares the draft's stored units
    untraced_attributes = (*StopPolicy.untraced_attributes, "h", "priced", "_unpriced")

    def __init__(
        self, head: AcceptanceHead, h: float, max_draft: int = DEFAULT_MAX_DRAFT, free: bool = True,
        priced: bool = False,
    ) -> None:  # fmt: skip
        lookahead = head.kind == "lookahead"
        # A lookahead head judges a candidate before it is fed: no free token, so its spec names none.
        super().__init__(SpecDecPPSpec(h=h, max=max_draft, free=None if lookahead else free,
                                       priced=True if priced else None))  # fmt: skip
        self.head = head.eval()
        self.h = h
        self.max_draft = max_draft
        self.priced = priced
        self.lookahead = lookahead
        self.needs_hidden = not lookahead
        self.needs_state = lookahead
        self.free_token = free and not lookahead
        self.judge_at = SAMPLE if lookahead else FEED
        # log c_k per judged count k. A tensor, so that the compiled step reads it as an input: a float
        # would be a constant of the graph (one compilation per threshold of a sweep).
        self._log_keep = torch.full((max_draft + 2,), math.log1p(-h), dtype=torch.float64)
        self._unpriced = priced  # priced, but no timings handed over yet: warn once, at a decode's start
        self.call = HeadCall(head)
        self._device = head.out.weight.device

    def to(self, device: torch.device | str) -> SpecDecPP:
        self.call.to(device)
        self._log_keep = self._log_keep.to(device)
        super().to(device)
        return self

    def attach_draft(self, model: torch.nn.Module) -> None:
        self.call.attach_draft(model)

    def price_widths(self, fed_ms: dict[int, float]) -> None:
        """Set the priced thresholds from the verifier's measured unit times (`RoundVerifier.fed_ms`);
        nothing unless `priced`. Written in place: the compiled draft steps keep reading the same tensor."""
        if not self.priced:
            return
        extra = 2 if self.free_token else 1
        self._unpriced = not fed_ms
        c = priced_thresholds(self.h, fed_ms, self.max_draft, extra)
        logs = [math.log(x) if x > 0 else -math.inf for x in c]
        self._log_keep.copy_(torch.tensor(logs, dtype=torch.float64))

    @property
    def thresholds(self) -> list[float]:
        """c_k for k = 0..max_draft + 1: stop after the k-th judged candidate once P̂ < c_k."""
        return torch.exp(self._log_keep).tolist()

    def lookahead_input(self, step: DraftStep) -> torch.Tensor:
        """The lookahead head's input for a candidate: (input_size,), as `acchead.lookahead` builds it."""
        return self.call.input(step)

    def start_decode(
        self, previous: PolicyRun | None = None, reference: list[list[bool]] | None = None
    ) -> PolicyRun:
        if self._unpriced:
            self._unpriced = False
            message = (f"{self.spec}: no verification widths were timed (the fast path's warm_up times "
                       "them), so this decoder runs the paper's threshold 1 - h")  # fmt: skip
            warnings.warn(message, stacklevel=3)
        return super().start_decode(previous, reference)

    def start_round(self, run: PolicyRun, position: int) -> int:
        # [log P̂, judged count] of the round, a tensor from the start so that every judged step is one unit
        run.stats = torch.zeros(2, dtype=torch.float64, device=self._device)
        return self.max_draft

    def should_stop(self, run: PolicyRun, step: DraftStep) -> bool:
        run.head_calls += 1
        return super().should_stop(run, step)

    def judge(self, step: DraftStep, stats: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        if stats is None:  # a caller that skipped `start_round`: the round's first judged candidate
            stats = torch.zeros(2, dtype=torch.float64, device=self._log_keep.device)
        log_p_hat = stats[0] + F.logsigmoid(self.call.logit(step).double())
        k = stats[1] + 1
        # a gather, not an index: a 0-d index tensor would be a data-dependent int in the compiled step
        last = self._log_keep.numel() - 1
        log_keep = self._log_keep.gather(0, k.clamp(max=last).long().view(1))[0]
        return log_p_hat < log_keep, torch.stack([log_p_hat, k])
