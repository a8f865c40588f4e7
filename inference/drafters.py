"""Drafters: what proposes the candidate tokens of a speculative round, one at a time.

A drafter sees the committed sequence plus the candidates it already proposed this round (the `context`),
and returns the next candidate together with the distribution q it was sampled from — the target's
verification needs the true q of whatever produced each token, or exactness is lost. Neural drafters can
also return their final hidden state after feeding the candidate (the SpecDec++ head's input); drafters
without one (Max-Gram, lookup tables) return None, and a head policy cannot run on them.

The decoder calls, per generation: `begin(...)` once; then per round `propose(...)` up to K times (or,
for a fixed-length round and a drafter with `round_unit`, `propose_block(...)` once) and `rollback(n)`
after verification (n = committed length); `warm_up(...)` before timed decodes. `draft_calls` counts
forward passes of the draft model; a model-free drafter keeps it at 0. Batch size 1 throughout.

`ModelDrafter` keeps everything on the model's device: the context it reads is the decoder's device
sequence, its candidate is a 0-d device tensor sampled with counter-based noise keyed by (seed, round
start, slot) (`acchead.inference.device_random`), and it never reads a value back to the host. The
Max-Gram drafter and cascades are host-driven: their proposals are host computations over the context.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedModel

from acchead.inference.device_path import DevicePath
from acchead.inference.device_random import DRAFT, key_hash, key_input
from acchead.inference.model_runner import make_runner
from acchead.inference.units import FEED, SAMPLE, DraftStep, draft_block_post, draft_post
from acchead.sampling import SamplingConfig

if TYPE_CHECKING:  # policies import this module (DraftStep)
    from acchead.inference.policies import PolicyRun


class Drafter(ABC):
    """The interface the decoder drives; see the module docstring for the call order.

    Every member the decoder reads is declared here, so it never probes a drafter: a subclass that misses
    an abstract method cannot be built (TypeError), and `SpeculativeDecoder` refuses an object that is
    not a `Drafter`. The typed defaults describe a host-driven drafter (Max-Gram, a cascade, a switch
    between drafters): no round unit, nothing to compile, candidates on the CPU.

    Attributes:
        draft_calls: forward passes of a draft model since `begin` (0 for a model-free drafter); set by
            every implementation's `begin`.
        round_unit: `propose_block` drafts a fixed-length round in one unit (the draft model on the device
            path); False: the decoder drafts such a round one `propose` at a time.
        device: where the candidates and their q live.
        reads_target_states: the drafter drafts from the target's final hidden states (a feature draft,
            `acchead.inference.feature_drafter`): the decoder hands it the accepted positions' states
            after each verification (`observe`) and drafts nothing until it is `ready`.
        ready: it can draft now (a feature drafter: once the target has handed over states).
        longest_round: the most candidates a round of its own (`own_round`) may hold; 0: it has none.
    """

    draft_calls: int
    round_unit: bool = False
    device: torch.device = torch.device("cpu")
    reads_target_states: bool = False
    ready: bool = True
    longest_round: int = 0

    @abstractmethod
    def begin(self, input_ids: torch.Tensor, sampling: SamplingConfig, seed: int) -> None:
        """Start a new sequence; input_ids: (T,) int64 prompt. Resets caches and `draft_calls`; `seed`
        keys every random draw of the sequence."""

    @abstractmethod
    def propose(
        self,
        context: torch.Tensor,
        index: int,
        want_hidden: bool,
        want_state: bool = False,
        judge: PolicyRun | None = None,
    ) -> DraftStep:
        """Next candidate after `context` ((T,) int64: committed tokens + this round's candidates).

        `want_hidden` asks for the hidden state of the candidate (costs a neural drafter one forward now,
        which it would pay at the next proposal anyway). `want_state` asks for the state that produced the
        candidate's q (free: it comes out of the forward that produced q). `judge`, the decode's policy run
        when this candidate will be judged: a drafter may run its rule inside its own unit and return the
        flag in `DraftStep.stop`; one that leaves `stop` None lets the run judge the step itself.
        """

    @abstractmethod
    def rollback(self, length: int) -> None:
        """Forget everything past the first `length` tokens (the committed prefix after verification)."""

    def own_round(self, prompt: list[int], generated: list[int], room: int) -> list[DraftStep] | None:
        """A round of at most `room` candidates after the committed tokens (host ints: the prompt, then the
        tokens generated so far) that the drafter proposes without the stop policy (copy rounds:
        `acchead.inference.copy_drafter`); None: the policy's round. Default: None."""
        return None

    def observe(self, states: torch.Tensor, start: int) -> None:  # noqa: B027 (only feature drafters read it)
        """The target's final hidden states (m, H) of committed positions start..start+m-1, handed over
        after a verification to a drafter that `reads_target_states`. Default: ignored."""

    def propose_block(self, context: torch.Tensor, count: int) -> list[DraftStep]:
        """All `count` candidates of a fixed-length round after `context` ((n,) committed tokens), none of
        them judged: by definition the candidates of `count` proposals. The decoder calls it when
        `round_unit` is set; a drafter with a round unit overrides it with one unit that draws the same."""
        n = context.numel()
        seq = torch.cat([context, context.new_zeros(count)])
        steps = []
        for k in range(1, count + 1):
            step = self.propose(seq[: n + k - 1], k, want_hidden=False)
            seq[n + k - 1] = step.token
            steps.append(step)
        return steps

    def warm_up(  # noqa: B027  (an optional hook: most drafters have nothing to prepare)
        self, max_length: int, sampling: SamplingConfig, policy: PolicyRun, longest: int = 0
    ) -> None:
        """Prepare the units a decode of up to `max_length` tokens under S and `policy` runs (the fast
        path compiles them here rather than inside a timed decode); `longest`: the most candidates a round
        may hold when that exceeds the policy's cap (a copy round's block). Default: nothing to prepare."""


@dataclass
class PendingDraw:
    """What the last forward produced for the next position: its candidate, drawn in the same unit."""

    slot: tuple[int, int]  # (round start, index) the candidate was keyed for
    q: torch.Tensor  # (V,)
    token: torch.Tensor  # 0-d int64
    logits: torch.Tensor | None  # (V,) greedy only
    state: torch.Tensor | None  # (H,) the state that produced q, if computed
    stop: torch.Tensor | None  # the stop flag of `token` (a SAMPLE-time rule), if judged


def draw_unit(
    runner, tokens: torch.Tensor, slot: tuple[int, int], *, seed: int, key_tensors: bool,
    sampling: SamplingConfig, policy: PolicyRun | None, judge_at: str, want_hidden: bool,
    features: torch.Tensor | None = None,
) -> tuple[PendingDraw, torch.Tensor | None]:  # fmt: skip
    """One draft unit of a model drafter (`ModelDrafter`, `FeatureDrafter`): feed `tokens` ((n,), with a
    feature draft's `features` (n, W)) after `runner`'s cache, draw the candidate of `slot` (round start,
    index) keyed by (seed, slot), and run `policy`'s rule when it judges at `judge_at` (its stats updated).
    Returns the pending draw (its `state`: the last fed position's hidden state, if asked or a feature
    draft's) and the flag of the fed token (a FEED-time rule), else None."""
    judge = policy.judge if policy is not None and policy.judge_at == judge_at else None
    stats = policy.stats if judge is not None else None
    key = key_input(key_hash(seed, DRAFT, *slot), runner.device, key_tensors)
    q, token, logits, hidden, flag, stats = runner.feed(
        tokens, keep=1, want_hidden=want_hidden, post=draft_post, features=features,
        post_args=(sampling, key, judge, judge_at, tokens[-1].to(runner.device), stats),
    )  # fmt: skip
    if judge is not None:
        policy.stats = stats
    pending = PendingDraw(slot, q, token, logits, hidden, flag if judge_at == SAMPLE else None)
    return pending, flag if judge_at == FEED else None


class ModelDrafter(Drafter):
    """A causal LM as drafter, with its own KV cache (a `ModelRunner`), rolled back after verification.

    Each forward is one unit with what follows it (`acchead.inference.units.draft_post`): S's processing,
    the draw of the next candidate and, when the decoder passes the policy, its stop rule. The cache always
    holds a prefix of the context; the candidate drawn after the last fed token is kept as pending, so the
    next proposal costs no forward: e.g. computing candidate k's hidden state also yields candidate k + 1,
    which is how the SpecDec++ "free token" costs nothing.

    Args:
        model: the draft model (eval mode, any device/dtype).
        fast: run it on the fast path (`StaticRunner`: static cache, compiled units) instead of eager.
        compile: on the fast path, capture the units (False: the static cache alone, for tests).
        round_unit: draft a fixed-K round as one unit (`propose_block`) instead of K step units. None: on
            the device path only, where it saves K - 1 launches and host round trips per round. On the CPU
            a compiled K-step graph measured slower than K one-step graphs (docs/speed.md: 0.94 vs 0.62 ms
            for two steps of the demo draft), so K step units run there; the draws are the same either way.
        device_path: take the CUDA default's branches (`acchead.inference.device_path`); None: on CUDA;
            a `DevicePath` also picks the compile backend.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        fast: bool = False,
        compile: bool = True,
        round_unit: bool | None = None,
        device_path: bool | DevicePath | None = None,
    ) -> None:
        self.model = model
        self.draft_calls = 0
        # Resolved once: `PreTrainedModel.device` walks the parameters on every access (~1 ms per draft
        # step in a profile of the decode loop).
        self.device: torch.device = model.device
        self.path = DevicePath.resolve(self.device, device_path)
        self.runner = make_runner(model, fast, compile, device_path=self.path)
        self.fast = fast
        # A compiled unit takes its random keys as tensors (an int would be a graph constant).
        self._key_tensors = fast and compile
        self._pending: PendingDraw | None = None
        self._sampling = SamplingConfig()
        self._seed = 0
        self.round_unit = self.path.round_unit_default if round_unit is None else round_unit

    def begin(self, input_ids: torch.Tensor, sampling: SamplingConfig, seed: int) -> None:
        self.runner.reset(input_ids.numel() + 1)  # a static cache grows as the sequence does
        self._pending = None
        self._sampling = sampling
        self._seed = seed
        self.draft_calls = 0

    def warm_up(self, max_length: int, sampling: SamplingConfig, policy: PolicyRun, longest: int = 0) -> None:
        """Prepare (fast path: compile) the draft's decode-time units for sequences up to `max_length`
        under S and a stop `policy`: 1 token per proposal, 2 after a round whose candidates were all
        accepted (the last candidate and the bonus token); unjudged and judged steps (the judged ones
        return the state or hidden state the policy's rule reads); for fixed K, the whole round."""
        self.runner.reset(max_length)
        self._sampling = sampling
        policy.start_round(0)  # the rule's starting stats
        judge = policy if policy.judge_at is not None else None
        dummy = torch.zeros(2, dtype=torch.long, device=self.device)
        self.runner.feed(dummy[:2])  # a prefill (eager: no unit compiled for it), then back to length 1
        self.runner.rollback(1)
        sample_units = {(False, None), (policy.needs_state, judge if policy.judge_at == SAMPLE else None)}
        for count in (1, 2):
            for want_state, rule in sample_units:
                self.runner.rollback(1)
                self._feed(dummy[:count], want_state, (0, 1), rule, SAMPLE)
        if policy.needs_hidden:
            self.runner.rollback(1)
            self._feed(dummy[:1], True, (0, 1), judge if policy.judge_at == FEED else None, FEED)
        if self.round_unit and policy.fixed_length and policy.max_cap > 0:  # the round as one unit
            k = policy.max_cap
            keys = key_hash(0, DRAFT, 0, torch.arange(1, k + 1, device=self.device))
            for count in (1, 2):
                self.runner.rollback(1)
                self.runner.feed(
                    dummy[:count], keep=1, post=draft_block_post, post_feeds=k - 1,
                    post_args=(sampling, keys, k),
                )  # fmt: skip
        self.runner.reset(max_length)
        self._pending = None

    def _feed(
        self,
        tokens: torch.Tensor,
        want_hidden: bool,
        slot: tuple[int, int],
        policy: PolicyRun | None,
        judge_at: str,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Run one unit on `tokens` ((n,) after the cached prefix): `draw_unit`. Sets `_pending`; returns
        (hidden (H,) or None, the flag of the fed token (a FEED-time rule) or None)."""
        self._pending, flag = draw_unit(
            self.runner, tokens, slot, seed=self._seed, key_tensors=self._key_tensors,
            sampling=self._sampling, policy=policy, judge_at=judge_at, want_hidden=want_hidden,
        )  # fmt: skip
        self.draft_calls += 1
        return self._pending.state, flag

    def propose(
        self,
        context: torch.Tensor,
        index: int,
        want_hidden: bool,
        want_state: bool = False,
        judge: PolicyRun | None = None,
    ) -> DraftStep:
        """As `Drafter.propose`; `judge`'s rule (when it judges at all: `judge_at`) runs inside the draft's
        units, and its flag comes back in `DraftStep.stop`."""
        policy = judge if judge is not None and judge.judge_at is not None else None
        n = context.numel()
        n0 = n - index + 1  # the round's start: with the slot, the key of this candidate's draw
        cached = self.runner.length
        if cached > n:
            self.rollback(n)
            cached = n
        pend = self._pending
        if pend is None or cached < n or pend.slot != (n0, index) or (want_state and pend.state is None):
            if cached == n:
                # Cache holds the whole context but its next candidate (or the state behind it) is
                # unknown: re-feed the last token (rare: a rollback landing exactly on the cache's end).
                self.runner.rollback(n - 1)
                cached = n - 1
            cached = self._catch_up(context, cached)
            self._feed(context[cached:], want_state, (n0, index), policy, SAMPLE)
            pend = self._pending
        assert pend is not None
        stop = pend.stop if policy is not None else None
        hidden = None
        if want_hidden:
            hidden, fed_stop = self._feed(pend.token.view(1), True, (n0, index + 1), policy, FEED)
            stop = fed_stop if fed_stop is not None else stop
        else:
            self._pending = None  # the pending candidate is now handed out
        state = pend.state if want_state else None
        return DraftStep(pend.token, pend.q, hidden, index, logits=pend.logits, state=state, stop=stop)

    def _catch_up(self, context: torch.Tensor, cached: int) -> int:
        """On the fast path, feed all but the last two tokens the cache lacks uncompiled (a copy round,
        `acchead.inference.copy_drafter`, leaves it behind by more than a round's units are compiled for:
        1 or 2 tokens; an empty cache's prompt runs uncompiled anyway); returns the cache's length."""
        if self.fast and cached > 0 and context.numel() - cached > 2:
            self.runner.feed(context[cached : context.numel() - 2], eager=True)
            self.draft_calls += 1
            cached = context.numel() - 2
        return cached

    def propose_block(self, context: torch.Tensor, count: int) -> list[DraftStep]:
        """All `count` candidates of a fixed-length round after `context` ((n,) committed tokens) in one
        unit (`acchead.inference.units.draft_block_post`): the same draws as `count` proposals, one
        forward each, with no step returning to Python in between."""
        n = context.numel()
        if self.runner.length >= n:  # the first forward must produce the logits after context[-1]
            self.rollback(n - 1)
        cached = self._catch_up(context, self.runner.length)
        slots = torch.arange(1, count + 1, device=self.device)
        keys = key_hash(self._seed, DRAFT, n, slots)  # (count,) int64: the per-step keys, as a tensor
        q, tokens = self.runner.feed(
            context[cached:], keep=1, post=draft_block_post, post_feeds=count - 1,
            post_args=(self._sampling, keys, count),
        )  # fmt: skip
        self.draft_calls += count
        self._pending = None
        return [DraftStep(tokens[i], q[i], None, i + 1) for i in range(count)]

    def rollback(self, length: int) -> None:
        if self.runner.length > length:
            self.runner.rollback(length)
            self._pending = None


class RoundBufferDrafter(Drafter):
    """Base for drafters that compute a whole block of candidates at once (Max-Gram, a cascade) and hand
    it out one candidate per `propose`.

    The buffer stays valid while the context is its base plus the candidates already handed out; a new
    round (index 1), or a policy drafting past the block, computes a fresh one. Subclasses implement
    `_propose_block` and call `_clear_block()` from `begin`.
    """

    def _clear_block(self) -> None:
        self._base = -1  # context length the buffered block starts after
        self._block: list[tuple[int, torch.Tensor]] = []

    @abstractmethod
    def _propose_block(self, context: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
        """(token, q) pairs continuing `context` ((T,) int64); q is the true (V,) distribution of each."""

    def propose(
        self,
        context: torch.Tensor,
        index: int,
        want_hidden: bool,
        want_state: bool = False,
        judge: PolicyRun | None = None,
    ) -> DraftStep:
        """As `Drafter.propose`; no hidden states and no rule of its own (the policy judges the step)."""
        n = int(context.numel())
        if index == 1 or not 0 <= n - self._base < len(self._block):
            self._base = n
            self._block = self._propose_block(context)
        token, q = self._block[n - self._base]
        return DraftStep(token=token, q=q, hidden=None, index=index)

    def rollback(self, length: int) -> None:
        self._clear_block()
