"""The drafter of a feature draft (EAGLE): drafts from the target's final hidden states.

A feature draft (`acchead.feature_draft`) reads, at pair j, the next token t_{j+1} and the target's state
f_j, and predicts f_{j+1} (its h_j) and t_{j+2}. So it drafts only after the target has run: the decoder
verifies the first round with no candidates (the prompt's forward gives the first token, as in
autoregressive decoding), and after every verification hands the drafter the states of the positions the
target accepted (`observe`). With n tokens committed, the target's states are known for positions
0..n-2 (the last committed token, the verifier's correction or bonus, has not been through the target), so
a round starts from pair n-2: (t_{n-1}, f_{n-2}) → h_{n-2} → candidate X_1 at position n. Candidate k + 1
reads the draft's own guess h in place of the target's state: (X_k, h of the step that drew X_k).

Cache bookkeeping: the draft's KV cache holds pairs built from true states only when a round starts;
the pairs a round fed on guessed states are cropped before the next one, and the accepted positions are
fed again with the target's states (EAGLE does the same). `draft_calls` counts the draft's forwards.

Draws are `acchead.inference.units.draft_post`'s with the same keys as `ModelDrafter` (seed, round start,
slot), so the sampling exactness suites treat both drafters alike. Eager path only, on any device; the
stop rule is left to the policy (`DraftStep.stop` is None).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from acchead.feature_draft import FeatureDraftForCausalLM
from acchead.inference.device_random import DRAFT, key_hash, key_input
from acchead.inference.drafters import Drafter
from acchead.inference.units import SAMPLE, DraftStep, draft_post
from acchead.kv_decode import KVSequence
from acchead.sampling import SamplingConfig

if TYPE_CHECKING:
    from acchead.inference.policies import PolicyRun


class FeatureDrafter(Drafter):
    """Drafts with a `FeatureDraftForCausalLM` from the target's states (module docstring).

    Args:
        model: the feature draft (eval mode, on the target's device or any other).
    """

    reads_target_states = True

    def __init__(self, model: FeatureDraftForCausalLM) -> None:
        self.model = model
        self.device: torch.device = model.device
        self.draft_calls = 0
        self._sampling = SamplingConfig()
        self._seed = 0
        self._reset()

    def _reset(self) -> None:
        self.seq = KVSequence(self.model, "the feature draft")  # its cache holds pairs
        self._true_pairs = 0  # of which the first are built on the target's states
        self._states = torch.empty(0, self.model.state_width, device=self.device)  # (known, W)
        # what the last forward left for the next position: (slot, q, token, logits, h that produced q)
        self._pending: tuple | None = None
        self._handed: tuple | None = None  # (slot, token, h that drew it) of the last candidate handed out

    def begin(self, input_ids: torch.Tensor, sampling: SamplingConfig, seed: int) -> None:
        self._reset()
        self._sampling = sampling
        self._seed = seed
        self.draft_calls = 0

    @property
    def ready(self) -> bool:
        """Whether the target has handed over any states (before the first verification it has not)."""
        return self._states.shape[0] > 0

    def observe(self, states: torch.Tensor, start: int) -> None:
        """The target's states (m, W) of positions start..start+m-1, all committed: its final hidden
        states, then the draft's fused layers' outputs (`FeatureDraftConfig.fused_layers`)."""
        known = self._states[:start]
        self._states = torch.cat([known, states.to(self.device, self._states.dtype)])

    def _forward(self, ids: torch.Tensor, features: torch.Tensor, slot: tuple[int, int]) -> None:
        """Feed pairs (ids (m,), features (m, W), or (m, H): the draft's own guess) after the cache; draw
        the candidate of `slot` from the last pair's h and keep it pending."""
        logits, h = self.seq.feed(ids[None], want_hidden=True, features=features[None])  # (1, 1, V), (1, H)
        self.draft_calls += 1
        logits, h = logits[0], h[0]  # (1, V): -inf outside the draft's vocabulary; (H,)
        key = key_input(key_hash(self._seed, DRAFT, *slot), self.device, False)
        q, token, kept, _, _, _ = draft_post(
            logits, h, self.model, self.seq.cache, self._sampling, key, None, SAMPLE, ids[-1], None
        )
        self._pending = (slot, q, token, kept, h)

    def propose(
        self,
        context: torch.Tensor,
        index: int,
        want_hidden: bool,
        want_state: bool = False,
        judge: PolicyRun | None = None,
    ) -> DraftStep:
        """As `Drafter.propose`. `hidden` (the h after feeding the candidate) costs the forward that also
        draws the next candidate; `state` is the h that produced q."""
        n = context.numel()
        n0 = n - index + 1  # committed length: the round's start
        if self._pending is None or self._pending[0] != (n0, index):
            if index == 1:
                self._start_round(context, n0)
            elif self._handed is not None and self._handed[0] == (n0, index - 1):
                # the candidate handed out last, fed with the h that drew it, draws this one
                _, token, state = self._handed
                self._forward(token.view(1), state[None], (n0, index))
            else:
                raise RuntimeError("a feature drafter drafts a round's candidates in order")
        slot, q, token, logits, state = self._pending
        hidden = None
        if want_hidden:  # feed the candidate with the h that drew it: its own h, and the next candidate
            self._forward(token.view(1), state[None], (n0, index + 1))
            hidden = self._pending[4]
            self._handed = None
        else:
            self._pending = None
            self._handed = (slot, token, state)
        return DraftStep(token, q, hidden, index, logits=logits, state=state if want_state else None)

    def _start_round(self, context: torch.Tensor, n0: int) -> None:
        """Crop the pairs fed on guessed states, feed pairs up to n0 - 2 on the target's states, and draw
        the round's first candidate."""
        if self._states.shape[0] < n0 - 1:
            raise RuntimeError(f"the target's states cover {self._states.shape[0]} of {n0 - 1} positions")
        keep = min(self._true_pairs, n0 - 2)  # at least the last pair is fed: its h draws X_1
        self.seq.crop(keep)
        ids = context[keep + 1 : n0]  # t_{j+1} for pairs keep..n0-2
        self._forward(ids, self._states[keep : n0 - 1], (n0, 1))
        self._true_pairs = n0 - 1

    def rollback(self, length: int) -> None:
        """Forget the pairs past the committed `length` (those built on guessed states go at the next
        round's start, which knows where the target's states end)."""
        self._states = self._states[: max(length - 1, 0)]
        self._true_pairs = min(self._true_pairs, max(length - 1, 0))
        self._pending = self._handed = None
