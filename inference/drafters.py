"""Drafters: what proposes the candidate tokens of a speculative round, one at a time.

A drafter sees the committed sequence plus the candidates it already proposed this round (the `context`),
and returns the next candidate together with the distribution q it was sampled from — the target's
verification needs the true q of whatever produced each token, or exactness is lost. Neural drafters can
also return their final hidden state after feeding the candidate (the SpecDec++ head's input); drafters
without one (Max-Gram, lookup tables) return None, and a head policy cannot run on them.

The decoder calls, per generation: `begin(...)` once; then per round `propose(...)` up to K times and
`rollback(n)` after verification (n = committed length). `draft_calls` counts forward passes of the draft
model; a model-free drafter keeps it at 0. Batch size 1 throughout.

`ModelDrafter` keeps everything on the model's device: the context it reads is the decoder's device
sequence, its candidate is a 0-d device tensor sampled with counter-based noise keyed by (seed, round
start, slot) (`acchead.inference.device_random`), and it never reads a value back to the host. The
Max-Gram drafter and cascades are host-driven: their proposals are host computations over the context.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from transformers import PreTrainedModel

from acchead.inference.device_random import DRAFT, key_hash, sample_token
from acchead.inference.model_runner import make_runner
from acchead.sampling import SamplingConfig, probs_from_logits


@dataclass
class DraftStep:
    """One proposed candidate.

    Attributes:
        token: the candidate token id: a 0-d int64 tensor on the drafter's device (a Python int from
            host-driven drafters and tests; both index tensors and fill the sequence alike).
        q: (V,) float32, the draft distribution the candidate was sampled from (after S's processing);
            one-hot for deterministic drafters.
        hidden: (H,) the drafter's final hidden state at the candidate's position — the vector its LM head
            reads after the candidate is fed (`acchead.models.final_hidden`), or None if not computed.
        index: 1-based position of the candidate within its round.
        logits: (V,) the draft's raw logits, kept only where q hides its confidence (greedy: q is one-hot);
            None otherwise.
        state: (H,) the drafter's final hidden state at the position BEFORE the candidate — the vector
            whose LM-head output is q (a lookahead head's input, DESIGN §3.1), or None if not computed.
    """

    token: torch.Tensor | int
    q: torch.Tensor
    hidden: torch.Tensor | None
    index: int
    logits: torch.Tensor | None = None
    state: torch.Tensor | None = None

    @property
    def confidence(self) -> torch.Tensor | None:
        """(V,) the distribution a confidence rule reads when it differs from q: softmax(logits) under
        greedy decoding (what Hugging Face's `assistant_confidence_threshold` reads); None means q.

        Computed on demand, so policies that never read it pay no softmax in the draft loop.
        """
        return None if self.logits is None else self.logits.float().softmax(-1)


@runtime_checkable
class Drafter(Protocol):
    """The interface the decoder drives; see the module docstring for the call order."""

    draft_calls: int

    def begin(self, input_ids: torch.Tensor, sampling: SamplingConfig, seed: int) -> None:
        """Start a new sequence; input_ids: (T,) int64 prompt. Resets caches and `draft_calls`; `seed`
        keys every random draw of the sequence."""
        ...

    def propose(
        self, context: torch.Tensor, index: int, want_hidden: bool, want_state: bool = False
    ) -> DraftStep:
        """Next candidate after `context` ((T,) int64: committed tokens + this round's candidates).

        `want_hidden` asks for the hidden state of the candidate (costs a neural drafter one forward now,
        which it would pay at the next proposal anyway). `want_state` asks for the state that produced the
        candidate's q (free: it comes out of the forward that produced q).
        """
        ...

    def rollback(self, length: int) -> None:
        """Forget everything past the first `length` tokens (the committed prefix after verification)."""
        ...


class ModelDrafter:
    """A causal LM as drafter, with its own KV cache (a `ModelRunner`), rolled back after verification.

    The cache always holds a prefix of the context. After feeding tokens, the distribution for the next
    position is kept as `pending` so that the next proposal costs no forward: e.g. computing candidate
    k's hidden state also yields q_{k+1}, which is how the SpecDec++ "free token" costs nothing.

    Args:
        model: the draft model (eval mode, any device/dtype).
        fast: run it on the fast path (`StaticRunner`: static cache, compiled forwards) instead of eager.
        compile: on the fast path, capture the forwards (False: the static cache alone, for tests).
    """

    def __init__(self, model: PreTrainedModel, fast: bool = False, compile: bool = True) -> None:
        self.model = model
        self.draft_calls = 0
        self.runner = make_runner(model, fast, compile)
        # Distribution (V,) for position `runner.length` given the cached tokens, and nothing else; None if
        # unknown.
        self._pending: torch.Tensor | None = None
        self._pending_logits: torch.Tensor | None = None
        self._pending_state: torch.Tensor | None = None  # (H,) the state `_pending` came from, if computed
        self._sampling = SamplingConfig()
        self._seed = 0
        # Resolved once: `PreTrainedModel.device` walks the parameters on every access (~1 ms per draft
        # step in a profile of the decode loop).
        self.device: torch.device = model.device

    def begin(self, input_ids: torch.Tensor, sampling: SamplingConfig, seed: int) -> None:
        self.runner.reset(input_ids.numel() + 1)  # a static cache grows as the sequence does
        self._pending = None
        self._sampling = sampling
        self._seed = seed
        self.draft_calls = 0

    def warm_up(self, max_length: int, hidden: tuple[bool, ...]) -> None:
        """Prepare (fast path: compile) the draft's decode-time forwards for sequences up to `max_length`:
        1 token per proposal, 2 after a round whose candidates were all accepted (the last candidate and
        the bonus token)."""
        self.runner.reset(max_length)
        self.runner.warm_up((1, 2), keep_all=False, hidden=hidden)

    def _feed(self, tokens: torch.Tensor, want_hidden: bool) -> torch.Tensor | None:
        """Run the draft on `tokens` ((n,) after the cached prefix); sets `_pending`, returns (H,) hidden."""
        logits, hidden = self.runner.feed(tokens, keep=1, want_hidden=want_hidden)
        self.draft_calls += 1
        logits = logits[-1]
        self._pending = probs_from_logits(logits, self._sampling)
        # Greedy q is one-hot; keep the logits so a confidence rule can read the draft's real confidence.
        self._pending_logits = logits if self._sampling.greedy else None
        self._pending_state = hidden
        return hidden

    def propose(
        self, context: torch.Tensor, index: int, want_hidden: bool, want_state: bool = False
    ) -> DraftStep:
        n = context.numel()
        cached = self.runner.length
        if cached > n:
            self.rollback(n)
            cached = n
        if self._pending is None or cached < n or (want_state and self._pending_state is None):
            if cached == n:
                # Cache holds the whole context but its next-token distribution (or the state behind it)
                # is unknown: re-feed the last token (rare: a rollback landing exactly on the cache's end).
                self.runner.rollback(n - 1)
                cached = n - 1
            self._feed(context[cached:], want_hidden=want_state)
        q, logits, state = self._pending, self._pending_logits, self._pending_state if want_state else None
        assert q is not None
        # Keyed by (round start n - index + 1, slot index): unique per candidate of a decode, so no noise
        # is ever reused after a rollback. Greedy q is one-hot: its argmax is the sample, no draw.
        key = key_hash(self._seed, DRAFT, n - index + 1, index)
        token = sample_token(q, self._sampling.greedy, key)
        hidden = None
        if want_hidden:
            hidden = self._feed(token.view(1), want_hidden=True)
        else:
            self._pending = None  # q belonged to the position now taken by the (unfed) candidate
        return DraftStep(token=token, q=q, hidden=hidden, index=index, logits=logits, state=state)

    def rollback(self, length: int) -> None:
        if self.runner.length > length:
            self.runner.rollback(length)
            self._pending = None


class RoundBufferDrafter:
    """Base for drafters that compute a whole block of candidates at once (Max-Gram, a cascade) and hand
    it out one candidate per `propose`.

    The buffer stays valid while the context is its base plus the candidates already handed out; a new
    round (index 1), or a policy drafting past the block, computes a fresh one. Subclasses implement
    `_propose_block` and call `_clear_block()` from `begin`.
    """

    draft_calls: int

    def _clear_block(self) -> None:
        self._base = -1  # context length the buffered block starts after
        self._block: list[tuple[int, torch.Tensor]] = []

    def _propose_block(self, context: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
        """(token, q) pairs continuing `context` ((T,) int64); q is the true (V,) distribution of each."""
        raise NotImplementedError

    def propose(
        self, context: torch.Tensor, index: int, want_hidden: bool, want_state: bool = False
    ) -> DraftStep:
        n = int(context.numel())
        if index == 1 or not 0 <= n - self._base < len(self._block):
            self._base = n
            self._block = self._propose_block(context)
        token, q = self._block[n - self._base]
        return DraftStep(token=token, q=q, hidden=None, index=index)

    def rollback(self, length: int) -> None:
        self._clear_block()

