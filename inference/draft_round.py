"""One round's drafting: the drafter proposes, the stop policy ends the round (DESIGN §4).

`draft_round` is the drafting half of `SpeculativeDecoder`'s round, module-level so that the exactness
tests (tests/test_exactness.py) enumerate this very function with a scripted drafter. It drives the
drafter only through the `Drafter` interface (`acchead.inference.drafters`), so every drafter takes the
same path: a fixed-length round goes to `propose_block` when the drafter has a round unit, every other
round is one `propose` per candidate with the policy judging between them.
"""

from __future__ import annotations

import torch

from acchead.inference.drafters import Drafter, DraftStep
from acchead.inference.policies import PolicyRun


def draft_round(drafter: Drafter, policy: PolicyRun, seq: torch.Tensor, n: int, cap: int) -> list[DraftStep]:
    """Draft up to `cap` candidates after seq[:n] and write them into seq[n:]; the policy stops the round.

    Args:
        drafter: proposes the candidates (its `begin` has run for this sequence).
        policy: the decode's run of the stop policy (`StopPolicy.start_decode`); its `start_round` has
            already been called (it returned the cap).
        seq: (≥ n + cap,) int64, the committed tokens in seq[:n]; seq[n : n + L] receives the candidates.
        n: the committed length.
        cap: the most candidates this round may draft (≥ 1).
    Returns:
        The L ≤ cap (+ 1 with a free token) proposed steps, in order.

    A candidate's hidden state (or, for a lookahead head, the state that produced it) is requested only
    when a stop decision follows it, i.e. not for the one that reaches the cap. After an early stop, a
    policy with `free_token` gets one more candidate from the q that the last forward already produced (a
    neural drafter pays no forward for it). Reads nothing back itself: the policy's `should_stop` reads one
    flag per judged candidate (a drafter that ran the rule in its own unit hands it over in
    `DraftStep.stop`), and fixed K none.
    """
    if drafter.round_unit and policy.fixed_length and cap == policy.max_cap:  # one unit: the whole round
        steps = drafter.propose_block(seq[:n], cap)
        seq[n : n + cap] = torch.stack([torch.as_tensor(s.token) for s in steps])
        return steps
    steps: list[DraftStep] = []
    while len(steps) < cap:
        k = len(steps) + 1
        judged = k < cap
        want_hidden, want_state = policy.needs_hidden and judged, policy.needs_state and judged
        step = drafter.propose(seq[: n + k - 1], k, want_hidden, want_state, judge=policy if judged else None)
        seq[n + k - 1] = step.token
        steps.append(step)
        if k == cap:
            break
        if policy.should_stop(step):
            if policy.free_token:
                step = drafter.propose(seq[: n + k], k + 1, want_hidden=False)
                seq[n + k] = step.token
                steps.append(step)
            break
    return steps
