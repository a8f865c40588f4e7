"""Stop policies: after each drafted candidate, keep drafting or hand the round to the target.

Policies are built from spec strings — the same strings every CLI takes:

    autoregressive                  no drafting; one target forward per token (the baseline)
    specdec:k=4                     fixed K candidates per round (Leviathan/Chen SpecDec)
    specdecpp:h=0.8,max=20,free=1   SpecDec++: stop once the head's P(some candidate rejected) > h;
                                    `specdecpp` alone uses the threshold the head records (its default_h)
    confidence:tau=0.4,max=20       stop after a candidate whose draft probability q(x) < tau (Hugging Face's
                                    `assistant_confidence_threshold`; the low-confidence token is kept;
                                    under greedy decoding q is one-hot, so softmax(draft logits) is read)
    entropy:tau=1.0,max=20          stop after a candidate whose draft distribution has entropy H(q) > tau
                                    nats (the high-entropy token is kept; greedy reads softmax(logits))
    adaedl:gamma=0.2,lam=0.5,adapt=1,max=20
                                    AdaEDL (Agrawal et al. 2024): stop after a candidate whose entropy
                                    bound 1 - sqrt(gamma·H(q)) < lam; adapt=1 moves lam online from the
                                    acceptance rate of finished rounds (paper's Algorithm 1), adapt=0 fixes it
    oracle[:max=64]                 greedy only: hindsight bound (paper Lemma 2.1), stops right before
                                    the first draft/target disagreement; a reference line, not a decoder

How the decoder drives a policy each round (see `SpeculativeDecoder`):

    cap = policy.start_round(position)         # candidate cap for this round (0 = autoregressive step)
    for each candidate k = 1..min(cap, tokens left - 1):
        step = drafter.propose(..., want_hidden=policy.needs_hidden and k < cap)
        if k < cap and policy.should_stop(step): break   [then, if policy.free_token, one more candidate]
    ... target verifies ...
    policy.end_round(drafted, accepted)

`needs_hidden` and `free_token` are read after `start_round`, so a composite policy (a bandit choosing an
arm per round) may change them per round. Decisions use only the drafted prefix and the draft's own
state, never the target's distribution of the round being verified — that is what keeps every policy
exact (BanditSpec Prop. 3.1); the oracle is the exception by design and is only run greedily, where the
output is deterministic anyway.

The SpecDec++ "free token": feeding candidate Y_k to the draft (needed for the head's e_k) also yields
q_{k+1}; when the head says stop, `free=1` (default) still appends Y_{k+1} ~ q_{k+1} — it costs no draft
forward, only one more position in the target's (parallel) verification forward. `free=0` drops it, so
the forward that produced q_{k+1} is wasted. With `free=1`, draft forwards == drafted tokens, as for
fixed-K SpecDec, which is the accounting the cost model (DESIGN §4) assumes.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from acchead.errors import AccheadError
from acchead.head import AcceptanceHead
from acchead.inference.drafters import DraftStep
from acchead.inference.head_call import HeadCall, rows
from acchead.inference.host_reads import read
from acchead.inference.units import FEED, SAMPLE

# Cap for policies whose spec gives none: the paper's SpecDec++ cap and Hugging Face's default
# `num_assistant_tokens`.
DEFAULT_MAX_DRAFT = 20
ORACLE_MAX_DRAFT = 64


class StopPolicy:
    """Base class: the decoder's view of a stop rule. Subclasses override what they need.

    Attributes:
        spec: canonical spec string (parse_policy(spec) rebuilds an equal policy).
        needs_hidden: the drafter must return each candidate's hidden state (head policies).
        needs_state: the drafter must return the state that produced each candidate's q (lookahead heads).
        free_token: on an early stop, append one more candidate from the already-computed q.
        greedy_only: refuse to run with sampling (the oracle).
        needs_reference: the decoder must give the policy hindsight via `set_reference` (the oracle).
    """

    spec: str = ""
    needs_hidden: bool = False
    needs_state: bool = False
    free_token: bool = False
    greedy_only: bool = False
    needs_reference: bool = False
    fixed_length: bool = False  # every round drafts `max_cap` candidates (never judged): one draft unit

    def start_round(self, position: int) -> int:
        """A round begins with `position` tokens already generated; returns the candidate cap (>= 0)."""
        raise NotImplementedError

    # When the rule can judge a candidate (`acchead.inference.units`): SAMPLE, right after drawing it (it
    # reads q, the logits, the state that produced q); FEED, after feeding it (candidate heads read the
    # hidden state after it); None: the rule never stops a round early.
    judge_at: str | None = None
    # The rule's running state on the device (e.g. SpecDec++'s log P̂), which `judge` threads through.
    stats: torch.Tensor | None = None

    def should_stop(self, step: DraftStep) -> bool:
        """After candidate `step.index` (not called for the candidate that reaches the cap). A rule that
        judges candidates computes its decision on the device with `judge` (the draft model's unit has
        usually done so already: `step.stop`) and reads the one flag back through
        `acchead.inference.host_reads.read`: the only host read it makes."""
        if self.judge_at is None:
            return False
        flag = step.stop
        if flag is None:
            flag, self.stats = self.judge(step, self.stats)
        return read(flag)

    def judge(self, step: DraftStep, stats: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The stop decision for a candidate as tensor ops: (0-d bool flag, new stats). Pure (no reads, no
        Python state changes), so the draft's compiled step traces it; constants are the policy's fields."""
        raise NotImplementedError

    @property
    def max_cap(self) -> int:
        """The largest cap `start_round` can return (the fast path compiles a verification per count)."""
        return getattr(self, "max_draft", DEFAULT_MAX_DRAFT)

    def end_round(self, drafted: int, accepted: int) -> None:
        """Feedback after verification (bandit selectors learn from it); default: nothing."""

    def set_reference(self, agree: list[bool]) -> None:
        """Hindsight for the oracle: agree[i] = the draft's greedy token at generated position i equals
        the target's. Only called when `needs_reference`."""

    _device = torch.device("cpu")  # the draft's: where `stats` lives

    def to(self, device: torch.device | str) -> StopPolicy:
        """Move any parameters (the head) and the rule's state to the draft's device; returns self."""
        self._device = torch.device(device)
        return self

    def attach_draft(self, model: torch.nn.Module) -> None:
        """Read what the policy needs of the draft model (a lookahead head: its output embedding)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec!r})"


class Autoregressive(StopPolicy):
    """No drafting: every round is one target forward that emits one token."""

    spec = "autoregressive"

    def start_round(self, position: int) -> int:
        return 0

    @property
    def max_cap(self) -> int:
        return 0


class FixedK(StopPolicy):
    """SpecDec: always draft k candidates."""

    # Every round drafts exactly k (fewer only at the end of a generation): the draft model drafts the k
    # candidates as one unit (`ModelDrafter.propose_block`).
    fixed_length = True

    def __init__(self, k: int) -> None:
        if k < 1:
            raise AccheadError(f"specdec needs K >= 1, got k={k}")
        self.k = k
        self.spec = f"specdec:k={k}"

    def start_round(self, position: int) -> int:
        return self.k

    @property
    def max_cap(self) -> int:
        return self.k


class SpecDecPP(StopPolicy):
    """SpecDec++ (paper Algorithm 2): stop when `1 - Π_j σ(f_j) > h`, or at `max_draft` candidates.

    With a `candidate` head (the paper's) f_j = f(e_j) reads the state after candidate Y_j was fed, so the
    drafter feeds each judged candidate at once and the first decision needs two draft forwards; on a stop
    the next candidate, whose q the last forward produced, is appended unjudged when `free`. With a
    `lookahead` head (DESIGN §3.1) f_j = f(s_{j-1}, Y_j) reads the state that produced q_j (plus the
    candidate's log q, entropy or output-embedding row, as the head was trained), right after Y_j is
    sampled: a stop verifies Y_1..Y_j, every verified candidate was judged, and no forward is spent on
    a candidate before it is judged, so a round can end after one draft forward. No free token then.

    The product P̂ is kept as a log (sum of log-sigmoids, float64, on the head's device), so long rounds
    never underflow, and the stop test is `log P̂ < log(1 - h)`: one host read per judged candidate. The
    head runs once per candidate through `HeadCall`, which keeps its per-call overhead to a few kernels and
    equals `head(x)` (pinned by tests).
    """

    def __init__(self, head: AcceptanceHead, h: float, max_draft: int = DEFAULT_MAX_DRAFT, free: bool = True):
        if not 0.0 < h < 1.0:
            raise AccheadError(f"specdecpp needs 0 < h < 1, got h={h}")
        if max_draft < 1:
            raise AccheadError(f"specdecpp needs max >= 1, got max={max_draft}")
        self.head = head.eval()
        self.h = h
        self.max_draft = max_draft
        self.lookahead = head.kind == "lookahead"
        self.needs_hidden = not self.lookahead
        self.needs_state = self.lookahead
        self.free_token = free and not self.lookahead
        self.judge_at = SAMPLE if self.lookahead else FEED
        self.spec = f"specdecpp:h={h:g},max={max_draft}" + ("" if self.lookahead else f",free={int(free)}")
        # Stop once log P̂ < log(1 - h). A tensor, so that the compiled step reads it as an input: a float
        # would be a constant of the graph (one compilation per threshold of a sweep).
        self._log_keep = torch.tensor(math.log1p(-h), dtype=torch.float64)
        self.head_calls = 0
        self.call = HeadCall(head)
        self._device = head.out.weight.device

    def to(self, device: torch.device | str) -> SpecDecPP:
        self.call.to(device)
        self._log_keep = self._log_keep.to(device)
        return super().to(device)

    def attach_draft(self, model: torch.nn.Module) -> None:
        self.call.attach_draft(model)

    def lookahead_input(self, step: DraftStep) -> torch.Tensor:
        """The lookahead head's input for a candidate: (input_size,), as `acchead.lookahead` builds it."""
        return self.call.input(step)

    def start_round(self, position: int) -> int:
        # log P̂ of the round, a tensor from the start so that every judged step is the same unit
        self.stats = torch.zeros((), dtype=torch.float64, device=self._device)
        return self.max_draft

    def should_stop(self, step: DraftStep) -> bool:
        self.head_calls += 1
        return super().should_stop(step)

    def judge(self, step: DraftStep, stats: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        log_p_hat = F.logsigmoid(self.call.logit(step).double())
        if stats is not None:  # None: the round's first judged candidate
            log_p_hat = stats + log_p_hat
        return log_p_hat < self._log_keep, log_p_hat


def threshold_input(value: float) -> torch.Tensor:
    """A rule's threshold as a 0-d float64 tensor: the draft's compiled step then reads it as an input, so
    one graph serves every threshold of a sweep (a float would be a constant of the graph: one compilation
    per value). `judge` casts it to the compared tensor's dtype, as a Python float would be cast."""
    return torch.tensor(value, dtype=torch.float64)


class Confidence(StopPolicy):
    """Stop after a candidate the draft itself found unlikely: q(x) < tau (the low-confidence token is
    kept, as in Hugging Face's `assistant_confidence_threshold`)."""

    def __init__(self, tau: float, max_draft: int = DEFAULT_MAX_DRAFT) -> None:
        if not 0.0 <= tau <= 1.0:
            raise AccheadError(f"confidence needs 0 <= tau <= 1, got tau={tau}")
        if max_draft < 1:
            raise AccheadError(f"confidence needs max >= 1, got max={max_draft}")
        self.tau = tau
        self._tau = threshold_input(tau)
        self.max_draft = max_draft
        self.spec = f"confidence:tau={tau:g},max={max_draft}"

    judge_at = SAMPLE

    def to(self, device: torch.device | str) -> Confidence:
        self._tau = self._tau.to(device)
        return super().to(device)

    def start_round(self, position: int) -> int:
        return self.max_draft

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
    tau = (1 − λ)² / γ (see `AdaEDL`).
    """

    def __init__(self, tau: float, max_draft: int = DEFAULT_MAX_DRAFT) -> None:
        if not (tau >= 0.0 and math.isfinite(tau)):
            raise AccheadError(f"entropy needs a finite tau >= 0 (nats), got tau={tau}")
        if max_draft < 1:
            raise AccheadError(f"entropy needs max >= 1, got max={max_draft}")
        self.tau = tau
        self._tau = threshold_input(tau)
        self.max_draft = max_draft
        self.spec = f"entropy:tau={tau:g},max={max_draft}"

    judge_at = SAMPLE

    def to(self, device: torch.device | str) -> Entropy:
        self._tau = self._tau.to(device)
        return super().to(device)

    def start_round(self, position: int) -> int:
        return self.max_draft

    def judge(self, step: DraftStep, stats: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        h = draft_entropy(step)
        return h > self._tau.to(h.dtype), stats


class AdaEDL(StopPolicy):
    """AdaEDL (Agrawal, Jeon, Lee 2024, arXiv 2410.18351): entropy-based early draft stopping.

    Stop rule: 1 − sqrt(γ·H(q_k)) is the paper's approximate lower bound on the acceptance probability of
    a candidate drawn from q_k (H in nats, `draft_entropy`); the round stops once it is < λ. With λ fixed
    (`adapt=0`) that is exactly `Entropy` with tau = (1 − λ)² / γ for λ ≤ 1 (λ > 1: stop after every
    candidate; λ ≤ 0: never stop early).

    Online λ (`adapt=1`), after each verified round with n_drafted candidates of which n_acc were accepted
    (the paper's Algorithm 1; β1 = 0.5, β2 = 0.9, ε = 0.01, target α = 0.9, γ = 0.2 are its §3.1 values):

        AR  ← β1·AR + (1 − β1)·n_acc / n_drafted
        λ'  = λ + ε   if AR < α           (acceptance too low: stop earlier)
              λ − ε   elif n_acc ≠ L      (L = `max_draft`, the maximum draft length)
              λ       otherwise
        λ   ← β2·λ + (1 − β2)·λ'          (so λ moves by at most (1 − β2)·ε = 0.001 per round)

    Provenance: the paper's PDF could not be read from this environment. The rule above is the one quoted
    as "the paper's Algorithm 1" by two independent public implementations (one says it transcribed it
    from the paper's LaTeX source), which agree on every term and constant; a third differs in the middle
    branch (λ − ε only when AR > α and n_acc = L). The paper leaves λ₀ open (it sweeps λ), hence `lam`.

    Choices the paper leaves open or that this decoder's round structure fixes:
      * AR starts at the target α, and λ and AR are reset at the start of every prompt (`start_round(0)`,
        as the bandit policies do), so a setting's result does not depend on prompt order or on resuming.
      * The rule is tested after candidate k is drafted, on the q_k it was drawn from, and that candidate
        is kept (like `Confidence`). The paper, as those implementations read it, tests the next position
        before sampling from it, so the draft forward that produced q_k is spent there too but its token
        is dropped; keeping it costs only one more position in the target's parallel forward, and
        n_drafted counts it.
      * The first candidate of a round is always drafted (the decoder consults the policy after each
        candidate), so n_drafted ≥ 1 and Algorithm 1's n_acc / n_drafted is never 0/0; a round with no
        candidate (the last token of a generation) leaves λ and AR unchanged.
      * Greedy decoding reads H of the draft's raw softmax, as `Confidence` does.
    Exactness: λ changes only in `end_round`, from finished rounds, so each stop decision depends on the
    past and the draft alone (BanditSpec Prop. 3.1).
    """

    def __init__(
        self,
        lam: float,
        gamma: float = 0.2,
        adapt: bool = True,
        max_draft: int = DEFAULT_MAX_DRAFT,
        *,
        target: float = 0.9,
        eps: float = 0.01,
        beta1: float = 0.5,
        beta2: float = 0.9,
    ) -> None:
        if not 0.0 <= lam <= 1.0:
            raise AccheadError(f"adaedl needs 0 <= lam <= 1, got lam={lam}")
        if not (gamma > 0.0 and math.isfinite(gamma)):
            raise AccheadError(f"adaedl needs a finite gamma > 0, got gamma={gamma}")
        if max_draft < 1:
            raise AccheadError(f"adaedl needs max >= 1, got max={max_draft}")
        if not (0.0 <= beta1 < 1.0 and 0.0 <= beta2 < 1.0 and eps >= 0.0):
            raise AccheadError(f"adaedl needs 0 <= beta1, beta2 < 1, eps >= 0; got {beta1}, {beta2}, {eps}")
        self.lam0 = lam
        self.gamma = gamma
        self.adapt = adapt
        self.max_draft = max_draft
        self.target, self.eps, self.beta1, self.beta2 = target, eps, beta1, beta2
        self.spec = f"adaedl:gamma={gamma:g},lam={lam:g},adapt={int(adapt)},max={max_draft}"
        self.lam = lam
        self.ar = target
        self.reset()

    def reset(self) -> None:
        """Start of a prompt: λ back to λ₀ and the acceptance-rate average back to the target."""
        self.lam = self.lam0
        self.ar = self.target

    def lower_bound(self, entropy: torch.Tensor | float) -> torch.Tensor:
        """The paper's acceptance lower bound 1 − sqrt(γ·H) for a draft distribution of entropy H."""
        return 1.0 - (self.gamma * torch.as_tensor(entropy).clamp_min(0.0)).sqrt()

    judge_at = SAMPLE

    def start_round(self, position: int) -> int:
        if position == 0:
            self.reset()
        # λ moves between rounds on the host; the device rule reads it as a tensor (a float would be a
        # constant of the compiled step: one recompile per value), filled by a kernel (no copy, no sync).
        self.stats = torch.full((), self.lam, dtype=torch.float64, device=self._device)
        return self.max_draft

    def judge(self, step: DraftStep, stats: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        bound = self.lower_bound(draft_entropy(step))
        lam = stats.to(device=bound.device, dtype=bound.dtype) if stats is not None else self.lam
        return bound < lam, stats

    def end_round(self, drafted: int, accepted: int) -> None:
        if not self.adapt or drafted <= 0:
            return
        self.ar = self.beta1 * self.ar + (1.0 - self.beta1) * accepted / drafted
        if self.ar < self.target:
            lam_p = self.lam + self.eps
        elif accepted != self.max_draft:
            lam_p = self.lam - self.eps
        else:
            lam_p = self.lam
        self.lam = self.beta2 * self.lam + (1.0 - self.beta2) * lam_p


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
        if max_draft < 1:
            raise AccheadError(f"oracle needs max >= 1, got max={max_draft}")
        self.max_draft = max_draft
        self.spec = "oracle" if max_draft == ORACLE_MAX_DRAFT else f"oracle:max={max_draft}"
        self._agree: list[bool] = []

    def set_reference(self, agree: list[bool]) -> None:
        self._agree = list(agree)

    def start_round(self, position: int) -> int:
        run = 0
        while position + run < len(self._agree) and self._agree[position + run] and run < self.max_draft:
            run += 1
        return run


# name -> (allowed keys, required keys)
_KEYS: dict[str, tuple[set[str], set[str]]] = {
    "autoregressive": (set(), set()),
    "specdec": ({"k"}, {"k"}),
    "specdecpp": ({"h", "max", "free"}, set()),  # no h: the head's recorded default_h
    "confidence": ({"tau", "max"}, {"tau"}),
    "entropy": ({"tau", "max"}, {"tau"}),
    "adaedl": ({"gamma", "lam", "adapt", "max"}, {"lam"}),
    "oracle": ({"max"}, set()),
}


def _parse_params(spec: str, name: str, body: str) -> dict[str, str]:
    params: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in body.split(","))):
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise AccheadError(f"cannot parse policy {spec!r}: expected key=value, got {item!r}")
        if key in params:
            raise AccheadError(f"cannot parse policy {spec!r}: {key!r} given twice")
        params[key] = value
    allowed, required = _KEYS[name]
    unknown = set(params) - allowed
    if unknown:
        hint = ", ".join(sorted(allowed)) or "no parameters"
        raise AccheadError(f"policy {name!r} takes {hint}; got {', '.join(sorted(unknown))}")
    missing = required - set(params)
    if missing:
        raise AccheadError(f"policy {spec!r} needs {', '.join(sorted(missing))} (e.g. {_EXAMPLES[name]})")
    return params


_EXAMPLES = {
    "autoregressive": "autoregressive",
    "specdec": "specdec:k=4",
    "specdecpp": "specdecpp:h=0.8,max=20",
    "confidence": "confidence:tau=0.4",
    "entropy": "entropy:tau=1.0",
    "adaedl": "adaedl:lam=0.5",
    "oracle": "oracle",
}


def _number(spec: str, key: str, value: str, kind: type) -> int | float:
    try:
        return kind(value)
    except ValueError:
        raise AccheadError(f"cannot parse policy {spec!r}: {key}={value!r} is not {kind.__name__}") from None


def _flag(spec: str, key: str, value: str) -> bool:
    if value.lower() in ("1", "true", "yes"):
        return True
    if value.lower() in ("0", "false", "no"):
        return False
    raise AccheadError(f"cannot parse policy {spec!r}: {key}={value!r} is not 0/1")


def needs_head(spec: str) -> bool:
    """True if the policy named by `spec` reads an acceptance head (without building it)."""
    return spec.strip().partition(":")[0].strip().lower() == "specdecpp"


# Parsers of composite specs by name: `ucb`/`exp3` (BanditSpec, in `acchead.inference.bandit_policy`). A
# composite is built from the policies of this module, so its module imports this one and registers its
# parser here; `parse_policy` imports that module on the first composite spec it meets (a module-level
# import would close an import cycle, and the CLIs' `--help` must not wait for torch).
_COMPOSITE_MODULES = {"ucb": "acchead.inference.bandit_policy", "exp3": "acchead.inference.bandit_policy"}
COMPOSITE_PARSERS: dict[str, Callable[..., StopPolicy]] = {}


def parse_policy(spec: str, *, head: AcceptanceHead | str | Path | None = None) -> StopPolicy:
    """Build a fresh StopPolicy from its spec string (see the module docstring for the grammar).

    Args:
        spec: e.g. "specdec:k=4", "specdecpp:h=0.8,max=20"; `specdecpp` without `h` takes the head's
            recorded threshold (`AcceptanceHead.default_h`).
        head: the acceptance head for `specdecpp`: a module, or a path given to `acchead.load_head`
            (without a draft check — `SpeculativeDecoder` does that check when it gets the path itself).

    Raises:
        AccheadError: unknown name or key, malformed number, specdecpp without a head, h outside (0, 1),
            K < 1.
    """
    name, _, body = spec.strip().partition(":")
    name = name.strip().lower()
    if name in _COMPOSITE_MODULES and name not in COMPOSITE_PARSERS:
        importlib.import_module(_COMPOSITE_MODULES[name])  # registers its parsers
    if name in COMPOSITE_PARSERS:  # BanditSpec: a selector over policy arms, ucb:arms=specdec:k=2|...
        return COMPOSITE_PARSERS[name](spec, head=head)
    if name not in _KEYS:
        names = ", ".join(_EXAMPLES.values())
        raise AccheadError(f"cannot parse policy {spec!r}: unknown name {name!r}; one of {names}")
    p = _parse_params(spec, name, body)
    if name == "autoregressive":
        return Autoregressive()
    if name == "specdec":
        return FixedK(int(_number(spec, "k", p["k"], int)))
    if name == "confidence":
        return Confidence(float(_number(spec, "tau", p["tau"], float)),
                          int(_number(spec, "max", p.get("max", str(DEFAULT_MAX_DRAFT)), int)))
    if name == "entropy":
        return Entropy(float(_number(spec, "tau", p["tau"], float)),
                       int(_number(spec, "max", p.get("max", str(DEFAULT_MAX_DRAFT)), int)))
    if name == "adaedl":
        return AdaEDL(
            float(_number(spec, "lam", p["lam"], float)),
            float(_number(spec, "gamma", p.get("gamma", "0.2"), float)),
            _flag(spec, "adapt", p.get("adapt", "1")),
            int(_number(spec, "max", p.get("max", str(DEFAULT_MAX_DRAFT)), int)),
        )
    if name == "oracle":
        return Oracle(int(_number(spec, "max", p.get("max", str(ORACLE_MAX_DRAFT)), int)))
    # specdecpp
    h = float(_number(spec, "h", p["h"], float)) if "h" in p else None
    max_draft = int(_number(spec, "max", p.get("max", str(DEFAULT_MAX_DRAFT)), int))
    free = _flag(spec, "free", p.get("free", "1"))
    if h is not None and not 0.0 < h < 1.0:
        raise AccheadError(f"specdecpp needs 0 < h < 1, got h={h}")
    if head is None:
        raise AccheadError(f"policy {spec!r} needs an acceptance head (give --head PATH or head=...)")
    if not isinstance(head, AcceptanceHead):
        from acchead.head_io import load_head

        head, _ = load_head(head)
    return SpecDecPP(head, head.default_h if h is None else h, max_draft, free)
