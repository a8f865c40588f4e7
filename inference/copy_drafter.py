"""Copy rounds: where the context's suffix recurs, a round copies what followed it instead of drafting.

A model draft and a copy of the context are right in different places: code repeats its prompt's names and
signatures, an answer quotes its question, and a small draft guesses those tokens one forward at a time
where the context already holds them (Max-Gram's observation, CS Drafting §3; prompt lookup; SAM-Decoding
switches between a suffix automaton's copy and an EAGLE draft the same way). `CopyDrafter` wraps the
decoder's drafter (a `ModelDrafter` or a `FeatureDrafter`). Before each round it looks for the longest
suffix of the committed tokens that occurs earlier in them (`acchead.inference.mag.longest_suffix_match`):

- a match of at least `min_match` tokens makes it a **copy round**: the candidates are the tokens that
  followed the match's leftmost occurrence (continued periodically when they run into the sequence's own
  end), up to `block` of them; no draft forward and no stop rule runs;
- otherwise the round is the wrapped drafter's, under the decoder's stop policy (SpecDec++'s head, fixed
  K, ...), as without copying.

Exact: a copy round is a deterministic function of the committed tokens, so each candidate's draft law q
is one-hot at it (as Max-Gram's) and the verifier accepts it with probability p(x); the wrapped drafter's
draws keep their keys. The wrapped drafter sees the copied tokens when it next drafts: it feeds what its
cache lacks (a feature draft: the target's states of the accepted positions, handed over after every
verification).

On the fast path the target verifies a copy round at its ladder width, which `warm_up` compiles up to
`block` + 1 too; a feature draft catches up in one forward at a ladder width (`FeatureDrafter`), a
token-level draft (`ModelDrafter`) in its compiled one- or two-token units; what either lacks beyond those
widths (copy rounds in a row) is fed uncompiled first, so no unit compiles inside a decode. The search
runs on the host over the committed tokens the decoder already holds there (no read of the device), and a
copy round's candidates go up in one copy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from acchead.inference.drafter_spec import CopySpec
from acchead.inference.drafters import Drafter
from acchead.inference.mag import longest_suffix_match
from acchead.inference.units import DraftStep
from acchead.sampling import SamplingConfig

if TYPE_CHECKING:
    from acchead.inference.policies import PolicyRun


def copy_continuation(seq: np.ndarray, min_match: int, count: int) -> list[int]:
    """Up to `count` tokens that followed the leftmost longest earlier occurrence of seq's suffix, when that
    suffix is at least `min_match` long; [] otherwise. seq: (T,) int64.

    A continuation that runs into seq's end (periodic text: the match overlaps the suffix itself) repeats
    with its period, end − match end, which is what copying it token by token would produce.
    """
    match = longest_suffix_match(seq)
    if match is None or match[0] < min_match:
        return []
    _, end = match
    period = seq.size - 1 - end  # tokens between the occurrence's end and the sequence's (≥ 1)
    return [int(seq[end + 1 + j % period]) for j in range(count)]


class CopyDrafter(Drafter):
    """`inner`'s rounds, or a copy of the context where its suffix recurs (module docstring).

    Args:
        inner: the drafter of the other rounds: a `ModelDrafter` (eager) or a `FeatureDrafter` (either path).
        spec: the match length that triggers a copy and the most candidates one copies.
        vocab_size: width of q (the target's vocabulary).

    Attributes:
        copied_rounds, copied_tokens: copy rounds and their candidates since `begin`.
    """

    def __init__(self, inner: Drafter, spec: CopySpec, vocab_size: int) -> None:
        self.inner = inner
        self.spec = spec
        self.vocab_size = vocab_size
        self.round_unit = inner.round_unit
        self.device = inner.device
        self.reads_target_states = inner.reads_target_states
        self.longest_round = spec.block
        self.copied_rounds = self.copied_tokens = 0

    @property
    def draft_calls(self) -> int:  # type: ignore[override]  (the wrapped drafter's forwards)
        return self.inner.draft_calls

    @property
    def ready(self) -> bool:  # type: ignore[override]
        return self.inner.ready

    def begin(self, input_ids: torch.Tensor, sampling: SamplingConfig, seed: int) -> None:
        self.inner.begin(input_ids, sampling, seed)
        self.copied_rounds = self.copied_tokens = 0

    def own_round(self, prompt: list[int], generated: list[int], room: int) -> list[DraftStep] | None:
        """A copy round of at most `room` candidates after prompt + generated (the committed tokens, on the
        host); None when their suffix does not recur (then the policy's round runs)."""
        context = np.asarray(prompt + generated, dtype=np.int64)
        tokens = copy_continuation(context, self.spec.min_match, min(self.spec.block, room))
        if not tokens:
            return None
        self.copied_rounds += 1
        self.copied_tokens += len(tokens)
        eye = torch.nn.functional.one_hot(torch.tensor(tokens), self.vocab_size).float()  # (L, V): q one-hot
        return [DraftStep(token=t, q=eye[i], hidden=None, index=i + 1) for i, t in enumerate(tokens)]

    def propose(
        self,
        context: torch.Tensor,
        index: int,
        want_hidden: bool,
        want_state: bool = False,
        judge: PolicyRun | None = None,
    ) -> DraftStep:
        return self.inner.propose(context, index, want_hidden, want_state, judge)

    def propose_block(self, context: torch.Tensor, count: int) -> list[DraftStep]:
        return self.inner.propose_block(context, count)

    def rollback(self, length: int) -> None:
        self.inner.rollback(length)

    def observe(self, states: torch.Tensor, start: int) -> None:
        self.inner.observe(states, start)

    def warm_up(self, max_length: int, sampling: SamplingConfig, policy: PolicyRun, longest: int = 0) -> None:
        self.inner.warm_up(max_length, sampling, policy, max(longest, self.longest_round))
