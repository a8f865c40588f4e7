"""The one KV-cached decode loop: prefill, then one token per step, until EOS or a token budget.

Everything in acchead that decodes token by token with transformers' eager forward goes through here:
the data stage's labeller (the target samples X while the draft follows), the oracle's hindsight
reference (greedy), the zoo's distillation windows (greedy or sampled, every step's logits kept), and,
as the cache owner, the decoders' eager runner (the feature drafter's too, whose pairs read the target's
states beside the ids: `feed(..., features=)`) and the cascade's reviewers.

- `KVSequence`: one model over B sequences growing together in one `DynamicCache`: `feed` appends
  columns and returns the logits of the last `keep` of them; `crop` forgets columns (transformers' public
  `.crop()`). Left-padded prompts are fed with their attention mask once, as the first feed; the sequence
  then keeps the mask and each row's position ids (real tokens only), so a row's numbers do not depend on
  its batch's padding beyond float rounding.
- `decode`: the loop. At step t a `choose(t, logits)` callback turns the next-token logits (B, V) into
  tokens (B,) (`greedy`, or any sampler the caller owns: a per-row uniform stream, a generator); rows that
  ended keep being fed `pad_id`, so the batch stays rectangular; `followers` (other `KVSequence`s over the
  same prompts) are fed the same tokens, so a second model decodes alongside without a second loop.

The cache is `DynamicCache()` without the model's config: full layers that `crop` can always roll back
(a sliding-window layer built from the config cannot restore states it dropped); the model's own mask
still applies any sliding window.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel

from acchead.errors import AccheadError
from acchead.lm_forward import lm_forward
from acchead.models import CACHE_ARG


def crop_cache(cache: DynamicCache, length: int) -> None:
    """Crop a transformers cache to its first `length` positions through the public `.crop()`."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)  # negative: the number of tokens to remove (transformers 5)


def position_ids(mask: torch.Tensor) -> torch.Tensor:
    """(B, T) attention mask -> (B, T) positions counting real tokens only (0 on left padding)."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


class KVSequence:
    """One causal LM over B sequences that grow together, with its KV cache.

    Args:
        model: the causal LM (eval mode, any device/dtype, may be sharded with a device map).
        name: what messages call it ("the draft").

    Attributes:
        length: columns in the cache (left padding included).
        logits: (B, V) the last fed position's logits (they predict the next token), None before a feed.
    """

    def __init__(self, model: PreTrainedModel, name: str = "the model") -> None:
        self.model, self.name = model, name
        # Resolved once: `PreTrainedModel.device` walks the parameters on every access.
        self.device: torch.device = model.device
        self.cache = DynamicCache()
        self.length = 0
        self.logits: torch.Tensor | None = None
        self._mask: torch.Tensor | None = None  # (B, length) 1 on real tokens; None: no padding anywhere
        self._real: torch.Tensor | None = None  # (B,) real tokens per row, the next token's position id

    @property
    def vocab_rows(self) -> int:
        """Token ids this model can be fed: its input embeddings' rows."""
        return self.model.get_input_embeddings().weight.size(0)

    def feed(
        self,
        ids: torch.Tensor,
        keep: int = 1,
        want_hidden: bool = False,
        mask: torch.Tensor | None = None,
        all_hidden: bool = False,
        features: torch.Tensor | None = None,
        state_layers: tuple[int, ...] = (),
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Append `ids` (B, n) (any device) after the cached columns.

        `mask` (B, n), 1 on real tokens, is accepted on the first feed only (left-padded prompts); later
        feeds are real tokens. `features` (B, n, H): a feature draft's (`acchead.feature_draft`) states
        read beside the ids, pair by pair. Returns logits (B, min(keep, n), V) of the last positions and,
        if `want_hidden`, the final hidden state (B, H) of the last position (`all_hidden`: (B, n, H),
        every fed position's; else None). `state_layers`: the hidden states also hold those decoder layers'
        outputs after the final state, (..., W) (the target of a feature draft with `fused_layers`).
        """
        n = ids.size(1)
        kwargs: dict[str, Any] = {}
        if mask is not None:
            if self.length:
                raise ValueError("a mask is accepted on the first feed only (left-padded prompts)")
            self._mask = mask.to(self.device)
            self._real = self._mask.sum(-1)
            # Positions count real tokens only (0 on the left padding).
            kwargs = {"attention_mask": self._mask, "position_ids": position_ids(self._mask)}
        elif self._mask is not None:
            self._mask = torch.cat([self._mask, self._mask.new_ones(self._mask.size(0), n)], dim=1)
            positions = self._real[:, None] + torch.arange(n, device=self.device)
            self._real = self._real + n
            kwargs = {"attention_mask": self._mask, "position_ids": positions}
        # The decoder stack and the head over the kept positions (`acchead.lm_forward`: the model's forward,
        # with the CPU's fast form of a few-row LM head).
        logits, hidden = lm_forward(
            self.model, ids.to(self.device), keep, want_hidden or all_hidden, n if all_hidden else None,
            features, state_layers, **kwargs, **{CACHE_ARG: self.cache}, use_cache=True,
        )  # fmt: skip
        self.length += n
        self.logits = logits[:, -1]
        if all_hidden:
            return logits, hidden
        return logits, hidden[:, -1] if want_hidden else None

    def crop(self, length: int) -> None:
        """Forget every column past the first `length` (`logits` is stale until the next feed)."""
        crop_cache(self.cache, length)
        self.length = min(self.length, length)
        if self._mask is not None:
            self._mask = self._mask[:, : self.length]
            self._real = self._mask.sum(-1)


def greedy(step: int, logits: torch.Tensor) -> torch.Tensor:
    """The `choose` of greedy decoding: each row's argmax, (B, V) -> (B,)."""
    return logits.argmax(-1)


@torch.no_grad()
def decode(
    seq: KVSequence,
    max_new_tokens: int,
    choose: Callable[[int, torch.Tensor], torch.Tensor] = greedy,
    *,
    eos_ids: Collection[int] = (),
    pad_id: int = 0,
    followers: Sequence[KVSequence] = (),
    feed_last: bool = False,
    host_read: Callable[[torch.Tensor], Any] = torch.Tensor.tolist,
) -> torch.Tensor:
    """Decode from a prefilled `seq` until every row has emitted an EOS or `max_new_tokens` steps ran.

    Args:
        seq: fed its prompts already (`seq.logits` predicts the first new token).
        choose: `choose(t, logits)`: step t's tokens (B,) from the next-token logits (B, V).
        eos_ids: a row ends right after the first of these (kept); rows that ended are fed `pad_id`.
        followers: other sequences fed the same tokens at every step (a second model decoding alongside,
            read by the caller's `choose` through their `logits`).
        feed_last: also feed the last step's tokens (then `seq.logits` predicts the token after them).
        host_read: how the loop's one device-to-host read per step (stop, and a token that a model cannot
            be fed) is made; the decoders pass their counted read.

    Returns:
        (B, T) int64 tokens of the T <= max_new_tokens steps run, on `seq`'s device; after a row's EOS
        its columns hold `pad_id`.

    Raises:
        AccheadError: a chosen token is outside the embeddings of `seq`'s or a follower's model.
    """
    if seq.logits is None:
        raise ValueError("decode needs a prefilled sequence (feed the prompts first)")
    bsz = seq.logits.size(0)
    dev = seq.logits.device
    models = (seq, *followers)
    rows = [s.vocab_rows for s in models]
    feedable = min(rows)
    eos = torch.tensor(sorted(eos_ids), dtype=torch.long, device=dev)
    done = torch.zeros(bsz, dtype=torch.bool, device=dev)
    steps: list[torch.Tensor] = []
    for t in range(max_new_tokens):
        tok = torch.where(done, pad_id, choose(t, seq.logits).to(dev))
        steps.append(tok)
        done = done | torch.isin(tok, eos)
        outside = tok >= feedable
        stop, bad = host_read(torch.stack([done.all(), outside.any()]))  # the one host read per step
        if bad:
            who = models[rows.index(feedable)].name
            token = tok[outside][0].item()
            raise AccheadError(f"decoded token {token}, outside {who}'s {feedable} embeddings")
        last = stop or t == max_new_tokens - 1
        if not last or feed_last:
            for s in models:
                s.feed(tok[:, None])
        if last:
            break
    return torch.stack(steps, 1) if steps else torch.zeros(bsz, 0, dtype=torch.long, device=dev)
