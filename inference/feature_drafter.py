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
slot), so the sampling exactness suites treat both drafters alike; like it, each forward is one unit with
the draw and, when the decoder passes the policy, its stop rule (`DraftStep.stop`).

The fast path (`fast=True`, `acchead.inference.static_runner`): a static cache and one compiled unit per
shape. A round's first forward feeds the pairs the cache lacks, one more than the candidates the target
accepted (1..cap + 1 of them): rather than a graph per count, it feeds a width of the verifier's ladder
(`VERIFY_WIDTHS`), starting that many pairs before the round's start and so feeding again a few pairs
already cached on the target's states (the same pairs: the same keys and values); its later forwards feed
one pair each. A decode then runs ~log(cap) graphs of the draft, all compiled by `warm_up`. A round that
lacks more pairs than the widest of them (after copy rounds in a row, `acchead.inference.copy_drafter`)
feeds the excess uncompiled first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from acchead.feature_draft import FeatureDraftForCausalLM
from acchead.inference.device_path import DevicePath
from acchead.inference.drafters import Drafter, PendingDraw, draw_unit
from acchead.inference.model_runner import make_runner
from acchead.inference.round_verifier import verify_width
from acchead.inference.units import FEED, SAMPLE, DraftStep
from acchead.sampling import SamplingConfig

if TYPE_CHECKING:
    from acchead.inference.policies import PolicyRun


class FeatureDrafter(Drafter):
    """Drafts with a `FeatureDraftForCausalLM` from the target's states (module docstring).

    Args:
        model: the feature draft (eval mode, on the target's device or any other).
        fast: run it on the fast path (static cache, compiled units) instead of eager.
        compile: on the fast path, capture the units (False: the static cache alone, for tests).
        device_path: take the CUDA default's branches (`acchead.inference.device_path`); None: on CUDA.
    """

    reads_target_states = True

    def __init__(
        self,
        model: FeatureDraftForCausalLM,
        fast: bool = False,
        compile: bool = True,
        device_path: bool | DevicePath | None = None,
    ) -> None:
        self.model = model
        self.device: torch.device = model.device
        self.fast = fast
        path = DevicePath.resolve(self.device, device_path)
        self.runner = make_runner(model, fast, compile, device_path=path)
        self._key_tensors = fast and compile  # a compiled unit takes its keys as tensors
        self.draft_calls = 0
        self._sampling = SamplingConfig()
        self._seed = 0
        self._widest: int | None = None  # the widest round start `warm_up` compiled (fast path)
        self._reset()

    def _reset(self) -> None:
        self._true_pairs = 0  # pairs in the cache built on the target's states
        # The target's states of the committed positions: the first `_known` rows of a buffer that grows
        # by doubling (a round writes its accepted rows in place, not a copy of the whole prefix).
        self._states = torch.empty(0, self.model.state_width, device=self.device)  # (capacity, W)
        self._known = 0
        self._pending: PendingDraw | None = None  # what the last forward drew for the next position
        self._handed: PendingDraw | None = None  # the last candidate handed out (with the h that drew it)

    def begin(self, input_ids: torch.Tensor, sampling: SamplingConfig, seed: int) -> None:
        self.runner.reset(input_ids.numel() + 1)
        self._reset()
        self._sampling = sampling
        self._seed = seed
        self.draft_calls = 0

    @property
    def ready(self) -> bool:
        """Whether the target has handed over any states (before the first verification it has not)."""
        return self._known > 0

    def observe(self, states: torch.Tensor, start: int) -> None:
        """The target's states (m, W) of positions start..start+m-1, all committed: its final hidden
        states, then the draft's fused layers' outputs (`FeatureDraftConfig.fused_layers`)."""
        end = start + states.shape[0]
        if end > self._states.shape[0]:
            grown = self._states.new_empty(max(end, 2 * self._states.shape[0]), self._states.shape[1])
            grown[:start] = self._states[:start]
            self._states = grown
        self._states[start:end] = states
        self._known = end

    def _forward(
        self, ids: torch.Tensor, features: torch.Tensor, slot: tuple[int, int], policy: PolicyRun | None,
        judge_at: str,
    ) -> torch.Tensor | None:  # fmt: skip
        """Feed pairs (ids (m,), features (m, W), or (m, H): the draft's own guess) after the cache in one
        unit (`draw_unit`): the candidate of `slot` drawn from the last pair's h (kept pending), and
        `policy`'s rule if it judges at `judge_at`. Returns the flag of the fed token (a FEED-time rule)."""
        self._pending, flag = draw_unit(
            self.runner, ids, slot, seed=self._seed, key_tensors=self._key_tensors, sampling=self._sampling,
            policy=policy, judge_at=judge_at, want_hidden=True, features=features,
        )  # fmt: skip
        self.draft_calls += 1
        return flag

    def propose(
        self,
        context: torch.Tensor,
        index: int,
        want_hidden: bool,
        want_state: bool = False,
        judge: PolicyRun | None = None,
    ) -> DraftStep:
        """As `Drafter.propose`. `hidden` (the h after feeding the candidate) costs the forward that also
        draws the next candidate; `state` is the h that produced q. `judge`'s rule runs in the units."""
        policy = judge if judge is not None and judge.judge_at is not None else None
        n = context.numel()
        n0 = n - index + 1  # committed length: the round's start
        if self._pending is None or self._pending.slot != (n0, index):
            if index == 1:
                self._start_round(context, n0, policy)
            elif self._handed is not None and self._handed.slot == (n0, index - 1):
                # the candidate handed out last, fed with the h that drew it, draws this one
                handed = self._handed
                self._forward(handed.token.view(1), handed.state[None], (n0, index), policy, SAMPLE)
            else:
                raise RuntimeError("a feature drafter drafts a round's candidates in order")
        pend = self._pending
        stop = pend.stop if policy is not None else None
        hidden = None
        if want_hidden:  # feed the candidate with the h that drew it: its own h, and the next candidate
            fed_stop = self._forward(pend.token.view(1), pend.state[None], (n0, index + 1), policy, FEED)
            hidden = self._pending.state
            stop = fed_stop if fed_stop is not None else stop
            self._handed = None
        else:
            self._pending = None
            self._handed = pend
        return DraftStep(pend.token, pend.q, hidden, index, logits=pend.logits,
                         state=pend.state if want_state else None, stop=stop)  # fmt: skip

    def _start_round(self, context: torch.Tensor, n0: int, policy: PolicyRun | None) -> None:
        """Crop the pairs fed on guessed states, feed pairs up to n0 - 2 on the target's states, and draw
        the round's first candidate (on the fast path, a ladder width of them: module docstring)."""
        if self._known < n0 - 1:
            raise RuntimeError(f"the target's states cover {self._known} of {n0 - 1} positions")
        keep = min(self._true_pairs, n0 - 2)  # at least the last pair is fed: its h draws X_1
        if self.fast and keep > 0 and self._widest is not None and n0 - 1 - keep > self._widest:
            # More pairs behind than the widest round start compiled (copy rounds in a row drafted
            # nothing): the excess is fed uncompiled, then the unit of that width draws X_1.
            cut = n0 - 1 - self._widest
            self.runner.rollback(keep)
            self.runner.feed(context[keep + 1 : cut + 1], features=self._states[keep:cut], eager=True)
            self.draft_calls += 1
            keep = cut
        if self.fast and keep > 0:
            keep = max(n0 - 1 - verify_width(n0 - 1 - keep), 0)
        self.runner.rollback(keep)
        self._forward(context[keep + 1 : n0], self._states[keep : n0 - 1], (n0, 1), policy, SAMPLE)
        self._true_pairs = n0 - 1

    def rollback(self, length: int) -> None:
        """Forget the pairs past the committed `length` (those built on guessed states go at the next
        round's start, which knows where the target's states end)."""
        self._known = min(self._known, max(length - 1, 0))
        self._true_pairs = min(self._true_pairs, max(length - 1, 0))
        self._pending = self._handed = None

    def warm_up(self, max_length: int, sampling: SamplingConfig, policy: PolicyRun, longest: int = 0) -> None:
        """Prepare (fast path: compile) the units a decode of up to `max_length` tokens under S and a stop
        `policy` runs: a round's first forward at the ladder width of every count of 1..cap + 1 pairs (cap:
        the policy's, or `longest` when a copy round may hold more candidates),
        judged when the policy judges its first candidate, and the one-pair forwards of later candidates,
        unjudged and judged (at SAMPLE, or FEED returning the hidden state)."""
        if not self.fast:
            return
        self._reset()
        self._sampling = sampling
        self.runner.reset(max_length)
        policy.start_round(0)  # the rule's starting stats
        judged = policy if policy.judge_at is not None and policy.max_cap > 1 else None
        ids = torch.zeros(max_length, dtype=torch.long, device=self.device)
        wide = torch.zeros(max_length, self.model.state_width, device=self.device)  # (·, W) target states
        guess = torch.zeros(1, self.model.config.hidden_size, device=self.device)  # (1, H) the draft's own
        self.runner.feed(ids[:2], features=wide[:2])  # a prefill (eager: no unit compiled for it)
        widths = sorted({verify_width(count) for count in range(1, max(policy.max_cap, longest) + 2)})
        for width in widths:
            self.runner.rollback(1)
            self._forward(ids[:width], wide[:width], (0, 1), judged, SAMPLE)
        for rule, at in {(None, SAMPLE), (judged, policy.judge_at or SAMPLE)}:
            self.runner.rollback(1)
            self._forward(ids[:1], guess, (0, 2), rule, at)
        self.runner.reset(max_length)
        self._reset()
        self._widest = widths[-1]
