"""A KV cache for B sequences of different lengths: one `DynamicCache`, holes masked, per-row rollback.

transformers' `DynamicCache` stores (B, heads, T, d) per layer: every row has the same number of slots T.
Batched speculative decoding needs rows that grow by different amounts each round (each keeps its own τ
candidates) and roll back by different amounts. Two designs keep every row's tokens exactly what the row
alone would compute:

- crop every row to the shortest row's length and re-feed the others' lost tokens: a forward wider than
  needed every round, and the re-fed tokens' keys would be recomputed in a different batch shape;
- (this module) a slot per fed token, and an explicit (B, T) validity mask: a row's rejected candidates and
  the padding of a narrower row are holes, masked out of every later attention through `attention_mask`.
  Rollback is a mask update (no copy); the cache is cropped when its last slots are holes in every row,
  and compacted (each row's valid slots gathered to the right end) when even the longest row fills less
  than half of it (slots > 2·longest + 8).

Why it is exact: a valid token's key and value depend only on its row's valid tokens before it (holes are
masked) and on its position id, which is the row's count of valid tokens before it (passed explicitly as
`position_ids`; RoPE is applied when a key is written, so moving a slot in a compaction changes nothing).
Causality holds because new tokens always take new slots at the end, so slot order is token order within
a row. The only difference from the row decoded alone is floating-point (other batch shapes, masked
sums), ~1e-7 on logits in float32. Hole queries see some valid key (or none, for left padding before a
row's first token: PyTorch's SDPA then returns zeros, not NaN; tests/test_batched.py checks the outputs
are finite and equal the unbatched row's).

Feeds are right-aligned: row b's `counts[b]` real tokens are the last ones of the (B, W) block and the
block's first W - counts[b] entries are holes, so the last `keep` positions of every row are its real
last tokens (the logits a verification or a draft step reads).

A sliding-window model (Mistral, Gemma 2 and 3) measures its window in slots, which holes would stretch: its
feeds pass a mask built from the rows' positions instead (`acchead.attention_window`).

Only public transformers API is used for the forward (`attention_mask`, `position_ids`, the cache
keyword `acchead.models.CACHE_ARG`, `DynamicCache.crop`, `batch_select_indices`); compaction reassigns each
`DynamicLayer`'s `keys`/`values` tensors, the layer's documented storage.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import DynamicCache, PreTrainedModel

from acchead.attention_window import sliding_windows, window_mask
from acchead.kv_decode import crop_cache
from acchead.lm_forward import lm_forward
from acchead.models import CACHE_ARG

# What a feed runs on its forward's output, in the same unit (the fast path compiles them together):
# (fn, per-row tensors, constants), called as fn(logits, hidden, model, cache, *per_row, *constants). Its
# outputs are per-row tensors ((R, ...); 0-d ones are batch-wide) or None.
Post = tuple[Callable[..., tuple], tuple, tuple]


class RaggedCache:
    """One model's KV cache for a batch of rows of different lengths (see the module docstring).

    Attributes:
        mask: (B, T) bool, slot t of row b holds one of the row's tokens.
        length: (B,) int64, the number of tokens each row holds (its valid slots).
    """

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        # Resolved once: `PreTrainedModel.device` walks the parameters on every access.
        self.device: torch.device = model.device
        # A sliding window is measured in a row's tokens, not in slots (holes would shorten it): such a model
        # gets a prepared mask by position (`acchead.attention_window`); None for every other model.
        self.windows = sliding_windows(model.config)
        self.reset(0)

    def reset(self, batch: int, capacity: int = 0) -> None:
        """Empty cache for `batch` rows (`capacity`: unused, a `DynamicCache` grows)."""
        self.cache = DynamicCache()
        self.mask = torch.zeros(batch, 0, dtype=torch.bool, device=self.device)
        self.length = torch.zeros(batch, dtype=torch.long, device=self.device)

    @property
    def slots(self) -> int:
        """T, the slots each row has (valid or hole)."""
        return int(self.mask.shape[1])

    def feed(
        self, tokens: torch.Tensor, counts: torch.Tensor, keep: int, want_hidden: bool = False,
        hidden_rows: int | None = None, features: torch.Tensor | None = None, post: Post | None = None,
        state_layers: tuple[int, ...] = (), eager: bool = True,
    ) -> tuple[torch.Tensor | None, ...]:  # fmt: skip
        """Append each row's next tokens and run the model on them (`eager`: always, here; the fast path's
        twin compiles its feeds unless told otherwise).

        Args:
            tokens: (B, W) int64, right-aligned: row b's real tokens are tokens[b, W - counts[b]:]; the
                entries before them are holes (any valid id; they are masked for every later token).
            counts: (B,) int64 in [0, W], how many real tokens each row feeds (0: the row waits).
            keep: how many last positions to return logits (and hidden states) for.
            want_hidden: also return the final hidden states (`acchead.models.final_hidden`).
            hidden_rows: how many last positions to return hidden states for (default `keep`).
            state_layers: the hidden states also hold these decoder layers' outputs after the final
                state, (B, hidden_rows, W) (the target of a feature draft with `fused_layers`).
            features: (B, W, H) for a feature draft (`acchead.feature_draft`): the state each pair reads
                beside its token, aligned like `tokens` (holes: any values).
            post: what runs on the output (`Post`; e.g. `acchead.inference.batched_step.draft_step`).
        Returns:
            logits (B, keep, V) and hidden (B, hidden_rows, H) or None. A row's position W - 1 - i is its i-th
            last real token when i < counts[b]; other rows' positions there are holes (ignore them). With
            `post`: its outputs instead.
        """
        width = tokens.shape[1]
        j = torch.arange(width, device=self.device)
        start = width - counts  # (B,) first real slot of each row in this block
        valid = j[None, :] >= start[:, None]
        # The row's count of valid tokens before each slot; holes get 0 (their position is unused).
        pos = (self.length[:, None] + j[None, :] - start[:, None]).clamp_min(0)
        mask = torch.cat([self.mask, valid], dim=1)
        # Without holes (B = 1 always: its rejected tail is cropped) the causal mask alone is exact, and the
        # model skips building a (B, 1, W, T) mask from the 2-D one.
        if bool(mask.all()):
            attention = None
        elif self.windows is None:
            attention = mask.long()
        else:
            attention = window_mask(self.windows, mask, pos, self.model.dtype)
        # a feature draft's pairs (t_{j+1}, f_j): a pair's position id is its index j, as a token's
        logits, hidden = lm_forward(
            self.model, tokens.to(self.device), keep, want_hidden, hidden_rows, features, state_layers,
            attention_mask=attention, position_ids=pos, **{CACHE_ARG: self.cache}, use_cache=True,
        )  # fmt: skip
        self.mask = mask
        self.length = self.length + counts
        if post is not None:
            fn, rows, constants = post
            return fn(logits, hidden, self.model, self.cache, *rows, *constants)
        return logits, hidden

    def rollback(self, length: torch.Tensor) -> None:
        """Keep the first `length[b]` tokens of each row ((B,) int64, at most the row's length)."""
        rank = self.mask.long().cumsum(1)  # 1-based index of each valid slot within its row
        self.mask = self.mask & (rank <= length[:, None])
        self.length = torch.minimum(self.length, length)
        self._shrink()

    def select(self, rows: torch.Tensor) -> None:
        """Keep only the rows `rows` ((R,) int64 indices, in that order): finished rows leave the batch."""
        if self.slots:
            self.cache.batch_select_indices(rows)
        self.mask = self.mask[rows]
        self.length = self.length[rows]
        self._shrink()

    def _shrink(self) -> None:
        """Crop trailing all-hole slots; compact when the longest row holds less than half the slots."""
        if not self.slots:
            return
        used = self.mask.any(0).nonzero()
        last = int(used[-1]) + 1 if used.numel() else 0
        if last < self.slots:
            crop_cache(self.cache, last)
            self.mask = self.mask[:, :last]
        longest = int(self.length.max()) if self.length.numel() else 0
        if self.slots > 2 * longest + 8:  # +8: do not compact short caches every round
            self._compact(longest)

    def _compact(self, longest: int) -> None:
        """Gather each row's valid slots to the right end of `longest` slots (holes on the left)."""
        slots = self.slots
        # Sort key: holes first, then valid slots in their order; the last `longest` entries are what stays.
        order = torch.where(self.mask, slots + torch.arange(slots, device=self.device), 0)
        idx = order.argsort(dim=1, stable=True)[:, slots - longest :]  # (B, longest)
        self.mask = self.mask.gather(1, idx)
        for layer in self.cache.layers:
            for name in ("keys", "values"):
                kv = getattr(layer, name)  # (B, heads, T, d)
                index = idx[:, None, :, None].expand(-1, kv.shape[1], -1, kv.shape[3])
                setattr(layer, name, kv.gather(2, index))


def right_aligned(seqs: list[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged token lists -> ((B, W) int64, each row's tokens at the right end, holes = 0; (B,) counts): the
    arguments of `RaggedCache.feed`."""
    width = max(len(s) for s in seqs)
    tokens = torch.tensor([[0] * (width - len(s)) + s for s in seqs], dtype=torch.long, device=device)
    return tokens, torch.tensor([len(s) for s in seqs], dtype=torch.long, device=device)
