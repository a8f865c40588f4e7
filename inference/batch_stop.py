"""The batch-level stop rule of batched SpecDec++: stop drafting when one more draft forward of the whole
batch costs more target-time than the rows still drafting are expected to gain from it.

Derivation (docs/batched.md has it at length). The paper's cost model (DESIGN §4) prices a decode at
T = t_draft·N_draft + t_target·N_target; SpecDec++'s Theorem 3.1 with its problem constant Δ set to 0 stops
a single sequence's round once P(some candidate rejected) ≥ c2 / (c1 + c2) with c1 = t_draft and
c2 = t_target − t_draft, i.e. once

    1 − P̂ ≥ 1 − c   ⟺   P̂ ≤ c,          c = t_draft / t_target,   P̂ = Π_j σ(f_j)

(so h = 1 − c: the shipped default h = 0.8 is c = 0.2, the demo pair's measured ratio). Read as a
marginal trade: another draft forward costs t_draft, and with probability P̂ (every candidate so far
accepted) its output is on the accepted path and is worth a target step, t_target; continue while
P̂·t_target > t_draft.

In a batch of B rows decoded in lockstep, one draft forward serves every row and costs t_draft(B); one
target forward emits at least one token per row, so a row's token is worth t_target(B) / B (what batched
autoregressive decoding pays for it). The draft forward's expected value is the sum over the rows still
drafting (R) of P̂_b tokens, each worth t_target(B) / B. Continue while

    Σ_{b∈R} P̂_b · t_target(B) / B  >  t_draft(B)   ⟺   Σ_{b∈R} P̂_b  >  c(B) · B,

with c(B) = t_draft(B) / t_target(B) the cost ratio at that batch size: declared, or measured on the
machine with what a step also costs the padded verification (`acchead.inference.batch_cost`). At B = 1 this
is the paper's rule (continue iff P̂ > c). Rows stop on their cap, EOS and max tokens and then wait
masked: they add nothing to the sum but still count in B, since the draft forward runs over them too. A
row's own threshold h is only a vote: below it the row drafts on while the batch does (its candidates are
free in lockstep) and its P̂ stays in the sum, the batch stopping too once no row would go on
(`acchead.inference.batched_step`). The rule only reads the past (the heads' outputs on this round's
drafted candidates), never the target's distributions of the round, so like every stop rule here it keeps
the output exact (BanditSpec Prop. 3.1; tests/test_batched.py).

The draft-only rules (confidence, entropy) run per row too (`row_rule_flags`); they have no P̂, so no
batch rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from acchead.errors import AccheadError
from acchead.inference.adaedl import AdaEDL
from acchead.inference.batch_cost import BatchCosts
from acchead.inference.policies import Confidence, Entropy, StopPolicy


@dataclass(frozen=True)
class BatchStop:
    """The batch rule with a cost ratio c(B) = the price of a batch draft step in rows' AR tokens.

    With `gate`, the batch also decides before each round whether to draft at all (`acchead.inference.
    round_gate`: once the rows' acceptance so far says autoregressive rounds finish the batch sooner, it
    decodes the rest autoregressively).

    Exactly one of: `c`, a declared ratio in (0, 1) for every B (`BatchStop.from_h(h)`: c = 1 − h, the
    ratio for which the paper's single-sequence threshold h is optimal, Δ = 0, so that at B = 1 the batch
    rule adds nothing to the rows' own rule); `costs`, ratios measured per batch size
    (`acchead.inference.batch_cost`); or `measure=True`, measure them at the batch sizes the decoder meets
    (`BatchedDecoder` fills `costs`).
    """

    c: float | None = None
    costs: BatchCosts | None = None
    measure: bool = False
    gate: bool = False

    def __post_init__(self) -> None:
        if (self.c is None) == (self.costs is None and not self.measure):
            raise AccheadError("the batch stop rule takes a declared c or measured costs, one of the two")
        if self.c is not None and not 0.0 < self.c < 1.0:
            raise AccheadError(f"the batch stop rule needs a cost ratio 0 < c < 1, got c={self.c}")

    @classmethod
    def from_h(cls, h: float) -> BatchStop:
        return cls(1.0 - h)

    def ratio(self, batch: int) -> float:
        """c(B) at `batch` rows: the declared c, or the measured costs interpolated at B."""
        if self.c is not None:
            return self.c
        if self.costs is None:
            raise AccheadError("the batch stop rule's costs are not measured yet (BatchedDecoder.calibrate)")
        return self.costs.c_at(batch)

    def round_ratio(self, batch: int, forwards: float) -> float:
        """A drafting round's seconds over an autoregressive round's at `batch` rows, with `forwards` (>= 1)
        draft forwards: measured, the timed rounds of that many forwards (`BatchCosts.round_ratio_at`;
        1 + c₁(B) + (forwards − 1)·c(B) from a table without them); declared, 1 + forwards·c."""
        if self.c is not None:
            return 1.0 + forwards * self.c
        self.ratio(batch)  # the one-line error when not measured yet
        assert self.costs is not None
        return self.costs.round_ratio_at(batch, forwards)

    def bound(self, batch: int) -> float:
        """c(B) · B: the expected accepted tokens a batch draft step of `batch` rows must be worth."""
        return self.ratio(batch) * batch

    def gain(self, log_p_hat: torch.Tensor, drafting: torch.Tensor) -> float:
        """`expected_gain` as a float."""
        return float(expected_gain(log_p_hat, drafting))

    def should_stop(self, log_p_hat: torch.Tensor, drafting: torch.Tensor, batch: int) -> bool:
        """Stop the whole batch's drafting: Σ_{b drafting} P̂_b ≤ c(B) · B (`batch` = B, the rows decoding,
        drafting or waiting). The decoder runs the same test as tensor ops (`batched_step.draft_step`)."""
        return self.gain(log_p_hat, drafting) <= self.bound(batch)

    @property
    def h(self) -> float | None:
        """The single-sequence threshold a declared c equals at B = 1 (None for measured costs)."""
        return None if self.c is None else 1.0 - self.c

    def __str__(self) -> str:
        if self.c is not None:
            return f"batch-stop:c={self.c:g}" + (",gate" if self.gate else "")
        name = "gated" if self.gate else "measured"
        return f"batch-stop:{name}({self.costs if self.costs is not None else 'pending'})"


def expected_gain(log_p_hat: torch.Tensor, drafting: torch.Tensor) -> torch.Tensor:
    """Expected accepted tokens one more batch draft step is worth: Σ_{b drafting} P̂_b (0-d float64).

    log_p_hat: (B,) log P̂ of each row's drafted candidates; drafting: (B,) bool, the rows still drafting
    (the others contribute nothing)."""
    return torch.where(drafting, log_p_hat.double().exp(), 0.0).sum()


def parse_batch_stop(value: str | float | bool | None, h: float | None) -> BatchStop | None:
    """`None`/False/"off": no batch rule; True/"on": c = 1 − h (the policy's threshold); "measured": c(B)
    measured by the decoder at its batch sizes; "gated": measured, with the round gate
    (`acchead.inference.round_gate`); a number: c."""
    if value is None or value is False or (isinstance(value, str) and value.lower() in ("off", "0", "no")):
        return None
    if value is True or (isinstance(value, str) and value.lower() in ("on", "1", "yes", "measured", "gated")):
        if h is None:
            raise AccheadError("the batch stop rule reads the heads' P̂: it needs a specdecpp policy")
        if isinstance(value, str) and value.lower() in ("measured", "gated"):
            return BatchStop(measure=True, gate=value.lower() == "gated")
        return BatchStop.from_h(h)
    try:
        c = float(value)
    except ValueError:
        raise AccheadError(
            f"batch stop must be on, off, measured, gated or a cost ratio c in (0, 1), got {value!r}"
        ) from None
    if not math.isfinite(c):
        raise AccheadError(f"batch stop ratio must be finite, got {value!r}")
    return BatchStop(c)


def row_rule_flags(
    policy: StopPolicy, q: torch.Tensor, logits: torch.Tensor, tokens: torch.Tensor, greedy: bool,
    lams: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """The draft-only rules (confidence, entropy, AdaEDL) for a batch of candidates, as their `judge` for
    one row.

    q: (R, V) the distributions the candidates were drawn from; logits: (R, V) the draft's raw logits;
    tokens: (R,) the candidates; lams: (R,) each row's AdaEDL λ this round. Under greedy decoding q is
    one-hot, so the rules read softmax(logits), as `DraftStep.confidence` and `draft_entropy` do. Returns
    (R,) bool: stop after this candidate.
    """
    if isinstance(policy, Confidence):
        dist = logits.float().softmax(-1) if greedy else q
        return dist.gather(-1, tokens[:, None].to(dist.device))[:, 0] < policy.tau
    if isinstance(policy, Entropy | AdaEDL):
        if greedy:
            logp = torch.log_softmax(logits.float(), -1)
            entropy = -(logp.exp() * logp).sum(-1)
        else:
            entropy = torch.special.entr(q).sum(-1)
        if isinstance(policy, Entropy):
            return entropy > policy.tau
        assert lams is not None, "AdaEDL's batched rule reads each row's λ"
        bound = policy.lower_bound(entropy)
        return bound < lams.to(device=bound.device, dtype=bound.dtype)
    raise AccheadError(f"no batched rule for {policy.spec!r}")
