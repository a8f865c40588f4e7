"""AdaEDL (Agrawal, Jeon, Lee 2024, arXiv 2410.18351): entropy-based early draft stopping, fixed or online λ.

Stop rule: 1 − sqrt(γ·H(q_k)) is the paper's approximate lower bound on the acceptance probability of a
candidate drawn from q_k (H in nats, `acchead.inference.policies.draft_entropy`); the round stops once it
is < λ. With λ fixed (`adapt=0`) that is exactly `Entropy` with tau = (1 − λ)² / γ for λ ≤ 1 (λ > 1: stop
after every candidate; λ ≤ 0: never stop early).

Online λ (`adapt=1`), after each verified round with n_drafted candidates of which n_acc were accepted
(the paper's Algorithm 1; β1 = 0.5, β2 = 0.9, ε = 0.01, target α = 0.9, γ = `ADAEDL_GAMMA` = 0.2 are its
§3.1 values):

    AR  ← β1·AR + (1 − β1)·n_acc / n_drafted
    λ'  = λ + ε   if AR < α           (acceptance too low: stop earlier)
          λ − ε   elif n_acc ≠ L      (L = `max_draft`, the maximum draft length)
          λ       otherwise
    λ   ← β2·λ + (1 − β2)·λ'          (so λ moves by at most (1 − β2)·ε = 0.001 per round)

Provenance: the paper's PDF could not be read from this environment. The rule above is the one quoted as
"the paper's Algorithm 1" by two independent public implementations (one says it transcribed it from the
paper's LaTeX source), which agree on every term and constant; a third differs in the middle branch
(λ − ε only when AR > α and n_acc = L). The paper leaves λ₀ open (it sweeps λ), hence `lam`.

Choices the paper leaves open or that this decoder's round structure fixes:
  * λ and AR live in the decode's `AdaEDLRun`: every decode (every prompt) starts from λ₀ and AR = α, so a
    setting's result does not depend on prompt order or on resuming.
  * The rule is tested after candidate k is drafted, on the q_k it was drawn from, and that candidate is
    kept (like `Confidence`). The paper, as those implementations read it, tests the next position before
    sampling from it, so the draft forward that produced q_k is spent there too but its token is dropped;
    keeping it costs only one more position in the target's parallel forward, and n_drafted counts it.
  * The first candidate of a round is always drafted (the decoder consults the policy after each
    candidate), so n_drafted ≥ 1 and Algorithm 1's n_acc / n_drafted is never 0/0; a round with no
    candidate (the last token of a generation) leaves λ and AR unchanged.
  * Greedy decoding reads H of the draft's raw softmax, as `Confidence` does.
Exactness: λ changes only in `end_round`, from finished rounds, so each stop decision depends on the past
and the draft alone (BanditSpec Prop. 3.1).
"""

from __future__ import annotations

import torch

from acchead.errors import AccheadError
from acchead.inference.drafters import DraftStep
from acchead.inference.policies import PolicyRun, StopPolicy, draft_entropy
from acchead.inference.policy_spec import ADAEDL_GAMMA, DEFAULT_MAX_DRAFT, AdaEDLSpec
from acchead.inference.units import SAMPLE


class AdaEDLRun(PolicyRun):
    """One decode's AdaEDL state: λ and the running acceptance-rate average AR (from λ₀ and α)."""

    def __init__(self, policy: AdaEDL) -> None:
        super().__init__(policy)
        self.lam = policy.lam0
        self.ar = policy.target


class AdaEDL(StopPolicy):
    """AdaEDL's stop rule and its online λ (see the module docstring); λ and AR live in `AdaEDLRun`."""

    judge_at = SAMPLE
    # `judge` reads λ from the round's stats and γ as a constant; the rest moves λ between rounds
    untraced_attributes = (
        *StopPolicy.untraced_attributes, "lam0", "adapt", "target", "eps", "beta1", "beta2"
    )  # fmt: skip

    def __init__(
        self,
        lam: float,
        gamma: float = ADAEDL_GAMMA,
        adapt: bool = True,
        max_draft: int = DEFAULT_MAX_DRAFT,
        *,
        target: float = 0.9,
        eps: float = 0.01,
        beta1: float = 0.5,
        beta2: float = 0.9,
    ) -> None:
        super().__init__(AdaEDLSpec(gamma=gamma, lam=lam, adapt=adapt, max=max_draft))
        if not (0.0 <= beta1 < 1.0 and 0.0 <= beta2 < 1.0 and eps >= 0.0):
            raise AccheadError(f"adaedl needs 0 <= beta1, beta2 < 1, eps >= 0; got {beta1}, {beta2}, {eps}")
        self.lam0 = lam
        self.gamma = gamma
        self.adapt = adapt
        self.max_draft = max_draft
        self.target, self.eps, self.beta1, self.beta2 = target, eps, beta1, beta2

    def start_decode(
        self, previous: PolicyRun | None = None, reference: list[list[bool]] | None = None
    ) -> AdaEDLRun:
        return AdaEDLRun(self)

    def lower_bound(self, entropy: torch.Tensor | float) -> torch.Tensor:
        """The paper's acceptance lower bound 1 − sqrt(γ·H) for a draft distribution of entropy H."""
        return 1.0 - (self.gamma * torch.as_tensor(entropy).clamp_min(0.0)).sqrt()

    def start_round(self, run: PolicyRun, position: int) -> int:
        assert isinstance(run, AdaEDLRun), "an AdaEDL round needs AdaEDL's run"
        # λ moves between rounds on the host; the device rule reads it as a tensor (a float would be a
        # constant of the compiled step: one recompile per value), filled by a kernel (no copy, no sync).
        run.stats = torch.full((), run.lam, dtype=torch.float64, device=self._device)
        return self.max_draft

    def judge(self, step: DraftStep, stats: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        assert stats is not None, "AdaEDL judges inside a round: `start_round` puts the round's λ in stats"
        bound = self.lower_bound(draft_entropy(step))
        return bound < stats.to(device=bound.device, dtype=bound.dtype), stats

    def end_round(self, run: PolicyRun, drafted: int, accepted: int) -> None:
        assert isinstance(run, AdaEDLRun), "an AdaEDL round needs AdaEDL's run"
        if not self.adapt or drafted <= 0:
            return
        run.ar = self.beta1 * run.ar + (1.0 - self.beta1) * accepted / drafted
        if run.ar < self.target:
            lam_p = run.lam + self.eps
        elif accepted != self.max_draft:
            lam_p = run.lam - self.eps
        else:
            lam_p = run.lam
        run.lam = self.beta2 * run.lam + (1.0 - self.beta2) * lam_p
