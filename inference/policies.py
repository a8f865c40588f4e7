"""Stop policies: after each drafted candidate, keep drafting or hand the round to the target.

A policy is built from its typed spec (`acchead.inference.policy_spec`, the grammar every CLI takes) and
does not change while decoding: what a decode changes (SpecDec++'s running log P̂, AdaEDL's λ, a bandit's
statistics, the oracle's reference) lives in a `PolicyRun`, which the decoder creates per decode with
`policy.start_decode(...)` and drives each round:

    run = policy.start_decode(previous, reference)   # per generate call (reference: the oracle's hindsight)
    cap = run.start_round(position)                  # candidate cap for this round (0 = autoregressive step)
    for each candidate k = 1..min(cap, tokens left - 1):
        step = drafter.propose(..., want_hidden=run.needs_hidden and k < cap, judge=run)
        if k < cap and run.should_stop(step): break   [then, if run.free_token, one more candidate]
    ... target verifies ...
    run.end_round(drafted, accepted)

`needs_hidden` and `free_token` are read from the run after `start_round`, so a composite policy (a
bandit choosing an arm per round) may change them per round. Decisions use only the drafted prefix and
the draft's own state, never the target's distribution of the round being verified — that is what keeps
every policy exact (BanditSpec Prop. 3.1); the oracle is the exception by design and is only run
greedily, where the output is deterministic anyway.

The SpecDec++ "free token": feeding candidate Y_k to the draft (needed for the head's e_k) also yields
q_{k+1}; when the head says stop, `free=1` (default) still appends Y_{k+1} ~ q_{k+1} — it costs no draft
forward, only one more position in the target's (parallel) verification forward. `free=0` drops it, so
the forward that produced q_{k+1} is wasted. With `free=1`, draft forwards == drafted tokens, as for
fixed-K SpecDec, which is the accounting the cost model (DESIGN §4) assumes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from acchead.inference.drafters import DraftStep
from acchead.inference.head_call import rows
from acchead.inference.host_reads import read
from acchead.inference.policy_spec import (
    DEFAULT_MAX_DRAFT,
    ORACLE_MAX_DRAFT,
    AutoregressiveSpec,
    ConfidenceSpec,
    EntropySpec,
    OracleSpec,
    PolicySpec,
    SpecDecSpec,
)
from acchead.inference.units import SAMPLE

if TYPE_CHECKING:
    from collections.abc import Callable


class StopPolicy:
    """Base class: the decoder's view of a stop rule, fixed for the decoder's lifetime.

    Attributes (constants of a policy; a bandit's run answers them per round):
        config: the resolved typed spec (every default filled in); `spec` is its string.
        needs_hidden: the drafter must return each candidate's hidden state (head policies).
        needs_state: the drafter must return the state that produced each candidate's q (lookahead heads).
        free_token: on an early stop, append one more candidate from the already-computed q.
        greedy_only: refuse to run with sampling (the oracle).
        needs_reference: the decoder must give `start_decode` the hindsight reference (the oracle).
        fixed_length: every round drafts `max_cap` candidates (never judged): one draft unit.
        judge_at: when the rule judges a candidate (`acchead.inference.units`): SAMPLE, right after drawing
            it (it reads q, the logits, the state that produced q); FEED, after feeding it (candidate heads
            read the hidden state after it); None: the rule never stops a round early.
    """

    needs_hidden = False
    needs_state = False
    free_token = False
    greedy_only = False
    needs_reference = False
    fixed_length = False
    judge_at: str | None = None
    # Attributes `judge` never reads (its thresholds reach it as tensors): policies that differ only in them
    # share the draft's stored units (`acchead.inference.unit_store`). Extend it in a subclass.
    untraced_attributes: tuple[str, ...] = ("config",)

    def __init__(self, config: PolicySpec) -> None:
        self.config = config
        self._device = torch.device("cpu")  # the draft's: where a run's `stats` live

    @property
    def spec(self) -> str:
        """The canonical spec string (`policy_build.parse_policy(spec)` rebuilds an equal policy)."""
        return self.config.to_spec()

    @property
    def max_cap(self) -> int:
        """The largest cap `start_round` can return (the fast path compiles a verification per count)."""
        return self.config.max_cap

    def start_decode(
        self, previous: PolicyRun | None = None, reference: list[list[bool]] | None = None
    ) -> PolicyRun:
        """A fresh run for one decode. `previous`: the run of the decoder's last decode (a bandit that
        carries its statistics across prompts continues it); `reference`: the oracle's hindsight."""
        return PolicyRun(self)

    def start_round(self, run: PolicyRun, position: int) -> int:
        """A round begins with `position` tokens already generated; returns the candidate cap (>= 0)."""
        return self.max_cap

    def should_stop(self, run: PolicyRun, step: DraftStep) -> bool:
        """After candidate `step.index` (not called for the candidate that reaches the cap). A rule that
        judges candidates computes its decision on the device with `judge` (the draft model's unit has
        usually done so already: `step.stop`) and reads the one flag back through
        `acchead.inference.host_reads.read`: the only host read it makes."""
        if self.judge_at is None:
            return False
        flag = step.stop
        if flag is None:
            flag, run.stats = self.judge(step, run.stats)
        return read(flag)

    def judge(self, step: DraftStep, stats: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The stop decision for a candidate as tensor ops: (0-d bool flag, new stats). Pure (no reads, no
        Python state changes), so the draft's compiled step traces it; constants are the policy's fields."""
        raise NotImplementedError

    def end_round(self, run: PolicyRun, drafted: int, accepted: int) -> None:
        """Feedback after verification (AdaEDL and the bandits learn from it); default: nothing."""

    def to(self, device: torch.device | str) -> StopPolicy:
        """Move any parameters (the head, thresholds) to the draft's device; returns self."""
        self._device = torch.device(device)
        return self

    def attach_draft(self, model: torch.nn.Module) -> None:
        """Read what the policy needs of the draft model (a lookahead head: its output embedding)."""

    def price_widths(self, fed_ms: dict[int, float]) -> None:
        """Read the fast path's measured verification costs (ms of the unit that verifies f fed tokens,
        `RoundVerifier.fed_ms`) after a warm-up; only a priced SpecDec++ uses them."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec!r})"


class PolicyRun:
    """One decode's state of a stop policy, and the handle the decoder drives the rounds through.

    Attributes:
        policy: the (unchanging) policy.
        stats: the rule's running state on the draft's device (e.g. SpecDec++'s log P̂ of the round),
            threaded through `judge` by the policy or by the drafter's unit that runs the rule.
        head_calls: acceptance-head evaluations in this decode.
    """

    def __init__(self, policy: StopPolicy) -> None:
        self.policy = policy
        self.stats: torch.Tensor | None = None
        self.head_calls = 0

    @property
    def spec(self) -> str:
        return self.policy.spec

    @property
    def needs_hidden(self) -> bool:
        return self.policy.needs_hidden

    @property
    def needs_state(self) -> bool:
        return self.policy.needs_state

    @property
    def free_token(self) -> bool:
        return self.policy.free_token

    @property
    def judge_at(self) -> str | None:
        return self.policy.judge_at

    @property
    def fixed_length(self) -> bool:
        return self.policy.fixed_length

    @property
    def max_cap(self) -> int:
        return self.policy.max_cap

    @property
    def judge(self) -> Callable[[DraftStep, torch.Tensor | None], tuple[torch.Tensor, torch.Tensor | None]]:
        # The policy's own bound method, the same object for every run: a compiled draft step that traced
        # it serves every decode (a method of the run would be a new object per decode).
        return self.policy.judge

    def start_round(self, position: int) -> int:
        return self.policy.start_round(self, position)

    def should_stop(self, step: DraftStep) -> bool:
        return self.policy.should_stop(self, step)

    def end_round(self, drafted: int, accepted: int) -> None:
        self.policy.end_round(self, drafted, accepted)


class Autoregressive(StopPolicy):
    """No drafting: every round is one target forward that emits one token."""

    def __init__(self) -> None:
        super().__init__(AutoregressiveSpec())


class FixedK(StopPolicy):
    """SpecDec: always draft k candidates."""

    # Every round drafts exactly k (fewer only at the end of a generation): the draft model drafts the k
    # candidates as one unit (`ModelDrafter.propose_block`).
    fixed_length = True

    def __init__(self, k: int) -> None:
        super().__init__(SpecDecSpec(k=k))
        self.k = k


def threshold_input(value: float) -> torch.Tensor:
    """A rule's threshold as a 0-d float64 tensor: the draft's compiled step then reads it as an input, so
    one graph serves every threshold of a sweep (a float would be a constant of the graph: one compilation
    per value). `judge` casts it to the compared tensor's dtype, as a Python float would be cast."""
    return torch.tensor(value, dtype=torch.float64)


class Confidence(StopPolicy):
    """Stop after a candidate the draft itself found unlikely: q(x) < tau (the low-confidence token is
    kept, as in Hugging Face's `assistant_confidence_threshold`)."""

    judge_at = SAMPLE
    untraced_attributes = (*StopPolicy.untraced_attributes, "tau")  # judge reads `_tau`

    def __init__(self, tau: float, max_draft: int = DEFAULT_MAX_DRAFT) -> None:
        super().__init__(ConfidenceSpec(tau=tau, max=max_draft))
        self.tau = tau
        self._tau = threshold_input(tau)
        self.max_draft = max_draft

    def to(self, device: torch.device | str) -> Confidence:
        self._tau = self._tau.to(device)
        super().to(device)
        return self

    def judge(self, step: DraftStep, stats: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        dist = step.q if step.confidence is None else step.confidence
        conf = rows(dist, step.token)[0]
        return conf < self._tau.to(conf.dtype), stats


def draft_entropy(step: DraftStep) -> torch.Tensor:
    """Shannon entropy H (nats) of the distribution a stop rule reads for `step`.

    Under sampling that is q, the distribution the candidate was drawn from (after S's temperature and
    top-k/top-p; zeros contribute 0). Under greedy decoding q is one-hot (H = 0), so, as for the confidence
    rule, the draft's raw softmax(logits) is read instead — computed here from log_softmax, which is
    stable for peaked logits. A model-free drafter (one-hot q, no logits) always has H = 0. A 0-d tensor on
    the draft's device.
    """
    if step.logits is not None:
        logp = torch.log_softmax(step.logits.float(), -1)
        return -(logp.exp() * logp).sum()
    return torch.special.entr(step.q).sum()


class Entropy(StopPolicy):
    """Stop after a candidate whose draft distribution is uncertain: H(q_k) > tau nats (the high-entropy
    candidate is kept, as `Confidence` keeps its low-confidence one). Reads only the draft, so exact.

    A 4096-token vocabulary has H ≤ ln 4096 ≈ 8.3 nats. Fixed-λ AdaEDL is this rule with
    tau = (1 − λ)² / γ (`acchead.inference.adaedl`).
    """

    judge_at = SAMPLE
    untraced_attributes = (*StopPolicy.untraced_attributes, "tau")  # judge reads `_tau`

    def __init__(self, tau: float, max_draft: int = DEFAULT_MAX_DRAFT) -> None:
        super().__init__(EntropySpec(tau=tau, max=max_draft))
        self.tau = tau
        self._tau = threshold_input(tau)
        self.max_draft = max_draft

    def to(self, device: torch.device | str) -> Entropy:
        self._tau = self._tau.to(device)
        super().to(device)
        return self

    def judge(self, step: DraftStep, stats: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        h = draft_entropy(step)
        return h > self._tau.to(h.dtype), stats


class OracleRun(PolicyRun):
    """The oracle's decode: `agree[k][i]` = the draft's greedy candidate of depth k (the (k+1)-th of a
    round) at generated position i equals the target's token (the hindsight reference the decoder computed
    before decoding). A draft whose candidates do not depend on their depth has one level, used at every
    depth; a feature draft has one per depth its runs reach (`acchead.feature_chain`)."""

    def __init__(self, policy: Oracle, agree: list[list[bool]]) -> None:
        super().__init__(policy)
        self.agree = agree


class Oracle(StopPolicy):
    """Hindsight bound (greedy only): draft exactly the run of candidates the target will accept.

    The decoder first decodes the target greedily and teacher-forces the draft over that output; the
    policy then caps each round at the length of the agreement run starting at the current position, so
    no drafted token is ever discarded (up to float ties between cached and uncached forwards, which the
    exact verification absorbs). The reference run is not counted in the stats.
    """

    greedy_only = True
    needs_reference = True

    def __init__(self, max_draft: int = ORACLE_MAX_DRAFT) -> None:
        # The default cap is left out of the spec: "oracle", not "oracle:max=64".
        super().__init__(OracleSpec(max=None if max_draft == ORACLE_MAX_DRAFT else max_draft))
        self.max_draft = max_draft

    def start_decode(
        self, previous: PolicyRun | None = None, reference: list[list[bool]] | None = None
    ) -> PolicyRun:
        return OracleRun(self, list(reference or ()))

    def start_round(self, run: PolicyRun, position: int) -> int:
        assert isinstance(run, OracleRun), "an oracle round needs the oracle's run"
        agree, length = run.agree, 0
        if not agree:
            return 0
        last = len(agree) - 1  # a run past the deepest level computed reads that level (the reference stops
        # computing levels once no run reaches them, so a feature draft's runs never get that far)
        while (
            position + length < len(agree[0])
            and agree[min(length, last)][position + length]
            and length < self.max_draft
        ):
            length += 1
        return length
