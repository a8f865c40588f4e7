"""Sliding-window attention over a ragged batch: the window measured in a row's tokens, not in cache slots.

A sliding-window model (Mistral; Gemma 2 and 3, Cohere 2 on alternate layers) lets a query at position q
attend to the keys of positions q - W + 1 .. q. transformers builds that mask from cache *slots*: a query in
slot s sees slots s - W + 1 .. s. With one sequence, or rows that grow together, a row's slots and its
positions differ by a constant and the two agree. A ragged batch (`acchead.inference.ragged_cache`) leaves
holes inside a row (rejected candidates, the padding of a narrow row in a block), so a key W - 1 tokens back
can sit W or more slots back and be hidden: the row would no longer decode as it does alone. Here the mask
is built from the row's own positions instead, and handed to the model as an already prepared mask (a
(B, 1, W, C) tensor, or one per layer type for models that mix full and sliding layers), which transformers
passes to the attention as it is.

Rows of a batch keep each valid slot's position implicitly: a valid slot's position is the count of valid
slots before it in its row (`ragged_cache`'s invariant), so `positions_of` recovers them with a cumsum.
"""

from __future__ import annotations

import torch

from acchead.errors import AccheadError

# Layer types (a config's `layer_types`) whose attention is full or slides by `config.sliding_window`.
_FULL, _SLIDING = "full_attention", "sliding_attention"


def sliding_windows(config) -> dict[str, int | None] | int | None:
    """How `config`'s layers attend, read as transformers' caches read it (`layer_types`, else
    `sliding_window` for every layer): None when no layer slides (the model's own mask is then exact in a
    ragged batch); the window W when every layer slides by it (Mistral's kind); else {layer type: W, or
    None for full attention} (Gemma 2's kind). Chunked attention (Llama 4's) is refused in one line."""
    text = config.get_text_config(decoder=True)
    types = getattr(text, "layer_types", None)
    window = getattr(text, "sliding_window", None)
    if types is None:
        if getattr(text, "attention_chunk_size", None) is not None:
            raise AccheadError(f"{type(config).__name__}: chunked attention is not supported in a batch")
        return None if window is None else int(window)
    unknown = set(types) - {_FULL, _SLIDING}
    if unknown:
        kinds = sorted(unknown)
        raise AccheadError(f"{type(config).__name__}: layer types {kinds} are not supported in a batch")
    if _SLIDING not in types:
        return None
    return {kind: (int(window) if kind == _SLIDING else None) for kind in set(types)}


def positions_of(valid: torch.Tensor) -> torch.Tensor:
    """valid (B, C) bool -> (B, C) int64: each valid slot's position in its row (holes: their row's count
    of valid slots before them, minus one; never read)."""
    return valid.long().cumsum(1) - 1


def window_mask(
    windows: dict[str, int | None] | int, valid: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor | dict[str, torch.Tensor]:
    """The prepared attention mask of one forward over a ragged batch.

    valid: (B, C) bool, the cache slots each row may attend to (the block's own included, in token order
    within a row); positions: (B, W) int64, the fed queries' positions (a hole's: any). Returns an additive
    mask (B, 1, W, C) of `dtype` (0 where a query sees a key, the dtype's minimum elsewhere: finite, so a
    hole query that sees nothing gives a finite, unused output), or one per layer type. A query at
    position q sees the valid keys at positions k with k <= q and, for a sliding layer, q - k < window."""
    keys = positions_of(valid)[:, None, :]  # (B, 1, C)
    queries = positions[:, :, None]  # (B, W, 1)
    seen = valid[:, None, :] & (keys <= queries)  # (B, W, C): causal by position within the row
    low = torch.finfo(dtype).min

    def additive(window: int | None) -> torch.Tensor:
        allowed = seen if window is None else seen & (queries - keys < window)
        zero = torch.zeros((), dtype=dtype, device=valid.device)
        return torch.where(allowed, zero, low)[:, None]  # (B, 1, W, C)

    if isinstance(windows, int):
        return additive(windows)
    return {kind: additive(window) for kind, window in windows.items()}
