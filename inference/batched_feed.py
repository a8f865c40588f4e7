"""How a batched round feeds its draft: token ids alone (an independent draft), or (token, state) pairs (a
feature draft, EAGLE), over one `RaggedCache` (or its fast-path twin, `StaticRaggedCache`).

`BatchedDecoder` drafts every row of a round in lockstep: one forward starts the round (each row's
committed ids the draft cache lacks; its last output draws candidate 1), then one forward per step feeds
each drafting row its last candidate (the others wait: a hole). A feed object owns the draft's cache and
knows what a forward reads:

- `TokenFeed`: the draft is a causal LM over ids; after verification its cache keeps each row's committed
  prefix (the rejected candidates become holes).
- `FeatureFeed`: the draft (`acchead.feature_draft`) reads at pair j the token t_{j+1} and the target's
  final hidden state f_j, exactly as `acchead.inference.feature_drafter.FeatureDrafter` drives it for one
  row: a round starting at n committed tokens feeds the pairs up to n - 2 on the target's states (known
  for positions 0..n-2), draws candidate 1 from the last pair's h, and candidate k + 1 reads
  (candidate k, the h that drew it). The verification hands each row the target's states of the
  positions it accepted (`observe`), and the pairs fed on the draft's own guesses leave the cache
  (`commit` keeps the pairs built on true states). Before the first verification no row has states, so
  the first round verifies no candidates (`ready`), as the single-row decoder's does.

Both return, per step, the (R, V) logits and (R, H) final hidden states of each row's last fed position,
or, given a `post` (the round's draft step, `acchead.inference.batched_step.draft_step`), its outputs,
computed in the forward's own unit.
"""

from __future__ import annotations

import time

import torch

from acchead.inference.ragged_cache import Post, RaggedCache, right_aligned


def _last(out: tuple, post: Post | None) -> tuple:
    """A feed's result: `post`'s outputs, or the logits and hidden states of the last fed position."""
    if post is not None:
        return out
    logits, hidden = out
    return logits[:, -1], hidden[:, -1] if hidden is not None else None


class TokenFeed:
    """An independent draft's feeds (module docstring)."""

    wants_target_states = False

    def __init__(self, cache: RaggedCache) -> None:
        self.cache = cache
        # the uncompiled catch-ups so far (a decode's first is the draft's prefill): seconds and tokens, the
        # rate the round gate prices a prefill at (on a GPU, with no host read, only their launches')
        self.catch_up_s, self.catch_up_tokens = 0.0, 0

    @property
    def ready(self) -> bool:
        return True

    def _timed_catch_up(self, start: float, tokens: int) -> None:
        self.catch_up_s += time.perf_counter() - start
        self.catch_up_tokens += tokens  # counted on the host: no device read

    def reset(self, batch: int, capacity: int = 0) -> None:
        """Empty caches for `batch` rows (`capacity`: the slots a static cache needs)."""
        self.cache.reset(batch, capacity)

    def select(self, rows: torch.Tensor) -> None:
        """Keep the rows `rows` ((R,) int64 indices): the others finished."""
        self.cache.select(rows.to(self.cache.device))

    def start(
        self, ids: list[list[int]], want_hidden: bool, post: Post | None = None, widest: int | None = None
    ) -> tuple:
        """The round's first forward: each row's committed `ids` past what the cache holds, of which it
        must miss at least the last (whose forward draws candidate 1). (R, V) logits, (R, H) hidden.
        `widest`: a row missing more than this many (after copy rounds) is fed the rest first, uncompiled."""
        cache = self.cache
        cache.rollback(torch.tensor([len(r) - 1 for r in ids], device=cache.device))
        pending = [r[h:] for r, h in zip(ids, cache.length.tolist(), strict=True)]
        if widest is not None and max(map(len, pending)) > widest:
            tokens, counts = right_aligned([p[:-widest] for p in pending], cache.device)
            start = time.perf_counter()
            cache.feed(tokens, counts, keep=1, eager=True)
            self._timed_catch_up(start, sum(len(p[:-widest]) for p in pending))
            pending = [p[-widest:] for p in pending]
        tokens, counts = right_aligned(pending, cache.device)
        return _last(cache.feed(tokens, counts, keep=1, want_hidden=want_hidden, post=post), post)

    def step(
        self, y: torch.Tensor, drafting: torch.Tensor, state: torch.Tensor | None, want_hidden: bool,
        post: Post | None = None,
    ) -> tuple:  # fmt: skip
        """Feed candidate y ((R,) int64) to the `drafting` rows ((R,) bool; the others wait)."""
        out = self.cache.feed(y[:, None], drafting.long(), keep=1, want_hidden=want_hidden, post=post)
        return _last(out, post)

    def observe(self, row: int, states: torch.Tensor) -> None:
        raise NotImplementedError("an independent draft reads no target states")

    def commit(self, kept: torch.Tensor) -> None:
        """After verification: each row keeps `kept[b]` ids ((R,) int64, its committed length minus one)."""
        self.cache.rollback(kept.to(self.cache.device))


class FeatureFeed(TokenFeed):
    """A feature draft's feeds (module docstring). `states[b]`: (known, W) the target's states
    of row b's positions 0..known-1."""

    wants_target_states = True

    def __init__(self, cache: RaggedCache) -> None:
        super().__init__(cache)
        self.state_width = int(cache.model.state_width)  # W: the final state and any fused layers' outputs

    @property
    def ready(self) -> bool:
        return all(s.shape[0] > 0 for s in self.states)

    def reset(self, batch: int, capacity: int = 0) -> None:
        super().reset(batch, capacity)
        self.states = [torch.empty(0, self.state_width, device=self.cache.device) for _ in range(batch)]
        self.true_pairs = [0] * batch  # pairs in the cache built on the target's states

    def select(self, rows: torch.Tensor) -> None:
        super().select(rows)
        keep = rows.tolist()
        self.states = [self.states[i] for i in keep]
        self.true_pairs = [self.true_pairs[i] for i in keep]

    def start(
        self, ids: list[list[int]], want_hidden: bool, post: Post | None = None, widest: int | None = None
    ) -> tuple:
        """Feed the pairs (t_{j+1}, f_j) the cache lacks up to j = n_b - 2 (at least that last one, whose h
        draws candidate 1) for each row of n_b committed ids; a row lacking more than `widest` pairs (after
        copy rounds) is fed the rest first, uncompiled."""
        cache, dev = self.cache, self.cache.device
        n = [len(r) for r in ids]
        for b, s in enumerate(self.states):
            if s.shape[0] < n[b] - 1:
                raise RuntimeError(f"row {b}: the target's states cover {s.shape[0]} of {n[b] - 1} positions")
        keep = [min(t, m - 2) for t, m in zip(self.true_pairs, n, strict=True)]
        cache.rollback(torch.tensor(keep, device=dev))
        if widest is not None and max(m - 1 - k for k, m in zip(keep, n, strict=True)) > widest:
            early = [max(k, m - 1 - widest) for k, m in zip(keep, n, strict=True)]  # pairs k+1.. early
            start = time.perf_counter()
            self._feed_pairs(ids, keep, early, None, eager=True)
            self._timed_catch_up(start, sum(e - k for e, k in zip(early, keep, strict=True)))
            keep = early
        out = self._feed_pairs(ids, keep, [m - 1 for m in n], post)
        self.true_pairs = [m - 1 for m in n]
        return _last(out, post)

    def _feed_pairs(
        self, ids: list[list[int]], lo: list[int], hi: list[int], post: Post | None, eager: bool = False
    ) -> tuple:
        """Feed row b's pairs (t_{j+1}, f_j) for j in lo[b]..hi[b] - 1, right-aligned."""
        dev = self.cache.device
        tokens, counts = right_aligned([r[k + 1 : m + 1] for r, k, m in zip(ids, lo, hi, strict=True)], dev)
        feats = torch.zeros(len(ids), tokens.shape[1], self.state_width, device=dev)  # (R, T, W), like ids
        for b, (k, m) in enumerate(zip(lo, hi, strict=True)):
            if m > k:
                feats[b, tokens.shape[1] - (m - k) :] = self.states[b][k:m]
        return self.cache.feed(tokens, counts, keep=1, want_hidden=True, features=feats, post=post,
                               eager=eager)  # fmt: skip

    def step(
        self, y: torch.Tensor, drafting: torch.Tensor, state: torch.Tensor | None, want_hidden: bool,
        post: Post | None = None,
    ) -> tuple:  # fmt: skip
        """Feed (candidate y, the h that drew it: `state` (R, H)) to the drafting rows. A draft with fused
        layers reads zeros in their place (widened here, so every feed of the draft has one shape)."""
        assert state is not None
        if state.shape[-1] < self.state_width:
            state = torch.nn.functional.pad(state, (0, self.state_width - state.shape[-1]))  # (R, W)
        out = self.cache.feed(y[:, None], drafting.long(), keep=1, want_hidden=True, features=state[:, None],
                              post=post)  # fmt: skip
        return _last(out, post)

    def observe(self, row: int, states: torch.Tensor) -> None:
        """The target's states (m, W) of row `row`'s next m positions, all committed."""
        self.states[row] = torch.cat([self.states[row], states.to(self.states[row].dtype)])

    def commit(self, kept: torch.Tensor) -> None:
        """Drop the pairs fed on the draft's guesses: the cache keeps the pairs built on true states."""
        self.cache.rollback(torch.tensor(self.true_pairs, device=self.cache.device))
