"""The batched fast path: `RaggedCache`'s rows, holes and rollback over a preallocated `StaticCache`, with
compiled forwards.

`acchead.inference.ragged_cache.RaggedCache` gives every fed token of every row a new slot and masks the
holes (left padding, a narrower row's padding, rejected candidates). That design needs no crop to roll a
row back, which is what makes it fit a static cache: all B rows write the same slots, so one shared write
position (the `StaticCache`'s own) advances by the block's width every forward, and a rollback is only a
mask update. When the slots run out, each row's valid slots are gathered to the left in place and the
write position moves back to the longest row (`StaticCache.crop`, as `StaticRunner` rolls back); only a
row longer than the whole cache makes it grow (a new cache: new graphs).

Every forward of a decode-time width W is one compiled graph, specialised on (B, W): the shapes of the
cache (B, heads, capacity, d), of the (B, capacity) validity mask (an input updated in place, so a graph
replay reads it) and of the (B, W) position ids. So that a policy with a cap of 20 does not compile 21
target graphs per B: on the CPU a block is padded (holes on the left) to the next width of the single-row
verification's ladder (`acchead.inference.round_verifier.VERIFY_WIDTHS`: 1, 2, 3, 4, 6, 8, 12, 16, 24,
...; nine graphs for that cap), and on the device path the widths from `SYMBOLIC_FROM` tokens share one
graph symbolic in W (as `StaticRunner`'s `symbolic` feeds), captured per width. A prompt (a new width every
call) runs eagerly on the same cache.

The batch size stays B for the whole decode: a finished row (`select` drops it) keeps its physical row,
all holes, which the forwards still run over (its share of the compute is wasted until the batch ends,
for one graph per (B, W) rather than one per row count); whatever it computes is never read.

Exactness is `RaggedCache`'s: a valid token's key depends only on its row's valid tokens and its position
id (the row's count of valid tokens before it); the causal mask compares slots, which keep token order
within a row (new tokens take new slots at the end; compaction keeps the order); a sliding window is
masked by position (`acchead.attention_window`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable
from typing import Any

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from acchead.attention_window import sliding_windows, window_mask
from acchead.errors import AccheadError
from acchead.feature_chain import install_output_hooks
from acchead.feature_draft import is_feature_draft
from acchead.inference.compile_regions import regions_for
from acchead.inference.compiled_units import arg_key, compile_units
from acchead.inference.device_path import DevicePath
from acchead.inference.ragged_cache import Post
from acchead.inference.round_verifier import VERIFY_WIDTHS, verify_width
from acchead.inference.static_runner import MAX_SYMBOLIC_COUNT, copy_out, new_static_cache
from acchead.lm_forward import lm_forward, splits_cleanly
from acchead.models import CACHE_ARG

# On the device path, widths of at least this many tokens share one graph, symbolic in the width (see the
# module docstring); on the CPU widths are padded to static graphs (`StaticRaggedCache.graph_width`).
SYMBOLIC_FROM = 5

# Capacity is rounded up to a multiple of this many slots (each capacity compiles its own graphs).
_CAPACITY_STEP = 64


def _rounded(slots: int) -> int:
    """`slots` rounded up to a multiple of `_CAPACITY_STEP`."""
    return -(-slots // _CAPACITY_STEP) * _CAPACITY_STEP


def ragged_forward(
    model: PreTrainedModel,
    cache,
    ids: torch.Tensor,
    attention: torch.Tensor,
    positions: torch.Tensor,
    features: torch.Tensor | None,
    keep: int,
    want_hidden: bool,
    hidden_rows: int,
    state_layers: tuple[int, ...] = (),
    post: Callable | None = None,
    *post_args: Any,
    windows: dict[str, int | None] | int | None = None,
) -> tuple[torch.Tensor | None, ...]:
    """One batched forward: the unit `torch.compile` captures. ids, positions (B, W); attention (B, C) bool,
    the slots each row may attend to (the block's own included); features (B, W, H) for a feature draft.
    keep / hidden_rows = 0: every fed position (a graph that does not specialise on W). Returns logits
    (B, keep, V) and the final hidden states (B, hidden_rows, H) (with `state_layers`, those decoder layers'
    outputs after them: (B, hidden_rows, W)) or None; with `post`, `post(logits, hidden, model, cache,
    *post_args)` instead, traced into the same graph (`Post`). `windows`: the model's sliding windows,
    masked here by position (`acchead.attention_window`)."""
    if windows is not None:
        attention = window_mask(windows, attention, positions, model.dtype)
    kwargs = {CACHE_ARG: cache, "attention_mask": attention, "position_ids": positions, "use_cache": True}
    width = ids.shape[1]
    logits, hidden = lm_forward(model, ids, keep or width, want_hidden, hidden_rows or width, features,
                                state_layers, split_checked=True, **kwargs)  # checked when the cache is built
    return (logits, hidden) if post is None else post(logits, hidden, model, cache, *post_args)


class StaticRaggedCache:
    """`RaggedCache`'s interface (reset, feed, rollback, select; mask, length, slots) on the fast path.

    Args:
        model: the causal LM or feature draft (eval mode); its weights are the compiled graphs' inputs,
            never frozen into them (`acchead.inference.compiled_units`).
        compile: False runs the same static-cache logic eagerly (the CPU twin the suite runs in seconds).
        device_path: as `StaticRunner`'s (`acchead.inference.device_path`): None picks the device's default.
        capacity: the initial slots per row, rounded up (compaction reuses them; a longer row grows them).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        compile: bool = True,
        device_path: bool | DevicePath | None = None,
        capacity: int = 256,
    ) -> None:
        self._model = weakref.ref(model)  # weakly: `ragged_cache`'s registry is keyed by the model
        self.device: torch.device = model.device
        self.path = DevicePath.resolve(self.device, device_path)
        if not is_feature_draft(model) and not splits_cleanly(model):
            raise AccheadError(
                f"{type(model).__name__}: its logits are not the LM head of the decoder's last hidden "
                "state, which the fast path computes; use the eager path"
            )
        self.compile = compile
        self.windows = sliding_windows(model.config)  # masked by position in `ragged_forward`
        # Per batch size and step rule, a compiled function of its own (its own dynamo cache): with one for
        # all sizes, the bench's warm-up at B = 16 once ran a graph of B = 4; with one for all rules, two
        # SpecDec++ decoders of one draft with different heads both ran the head compiled last (a seen key
        # skips dynamo's guards: forty-first session, tests/test_batched_fast.py).
        self._calls: dict[Hashable, Callable] = {}
        self.capacity = _rounded(capacity)
        self.cache = None
        self._caches: dict[int, tuple] = {}  # batch size -> (its StaticCache, capacity)
        self.used = 0
        self.reset(0)

    @property
    def model(self) -> PreTrainedModel:
        return self._model()

    # ------------------------------------------------------------------------------------------- state

    @property
    def mask(self) -> torch.Tensor:
        """(R, T) bool over the active rows' used slots (`RaggedCache.mask`)."""
        return self._mask[self.rows, : self.used]

    @property
    def length(self) -> torch.Tensor:
        """(R,) int64, the tokens each active row holds (read it, do not write it)."""
        # No row finished (as `feed`, which scatters only then): the tensor itself, not a gather (~30 us a
        # round at B = 1 on the CPU)
        return self._length if len(self.rows) == self.batch else self._length[self.rows]

    @property
    def slots(self) -> int:
        """T, the slots written so far (valid or hole) since the last compaction."""
        return self.used

    def reset(self, batch: int, capacity: int = 0) -> None:
        """Empty cache for `batch` rows with room for `capacity` slots (at least). Each batch size keeps its
        own `StaticCache` for the object's life (a captured graph reads its tensors in place); a larger
        capacity allocates a new one (its graphs compile again)."""
        if self.cache is not None and self.used:
            self._crop_to(0)  # idle caches wait empty
        self.batch, self.used = batch, 0
        if batch:
            have = self._caches.get(batch)
            if have is None or capacity > have[1]:
                self._alloc(batch, max(capacity, have[1] if have else self.capacity))
            self.cache, self.capacity = self._caches[batch]
        self.rows = torch.arange(batch, device=self.device)
        self._mask = torch.zeros(batch, self.capacity, dtype=torch.bool, device=self.device)
        self._length = torch.zeros(batch, dtype=torch.long, device=self.device)

    def _alloc(self, batch: int, capacity: int) -> None:
        """A new `StaticCache` of (batch, capacity) for this batch size, allocated now by one eager forward
        (so that its tensors' addresses never change), then emptied."""
        capacity = _rounded(capacity)
        self.cache = new_static_cache(self.model.config, capacity)
        with torch.inference_mode():
            ids = torch.ones(batch, 1, dtype=torch.long, device=self.device)
            mask = torch.ones(batch, capacity, dtype=torch.bool, device=self.device)
            ragged_forward(self.model, self.cache, ids, mask, ids * 0, self._zero_features(ids), 1, False, 1)
        self.used = 1
        self._crop_to(0)
        self._caches[batch] = (self.cache, capacity)

    def _zero_features(self, ids: torch.Tensor) -> torch.Tensor | None:
        if not is_feature_draft(self.model):
            return None
        return torch.zeros(*ids.shape, int(self.model.config.hidden_size), device=self.device)

    def _crop_to(self, used: int) -> None:
        """Move the shared write position back to `used` slots (public `crop`, in place)."""
        with torch.inference_mode():
            self.cache.crop(used - self.used)
        self.used = used

    def graph_width(self, width: int) -> int:
        """The width of the graph a feed of `width` tokens runs. On the CPU the next width of the single-row
        verification's ladder (`VERIFY_WIDTHS`; holes pad the block on the left): static graphs, since
        Inductor's kernels for a symbolic row count ran a toy-pair verification at B = 1 ~40% slower
        (docs/batched.md). On the device path through Inductor the width itself (from `SYMBOLIC_FROM`: one
        symbolic graph, captured per width); the `cudagraphs` backend takes the ladder's static graphs
        (`DevicePath.symbolic_shapes`)."""
        return width if self.path.symbolic_shapes else verify_width(width)

    def graph_widths(self, widest: int) -> list[int]:
        """Widths whose feeds compile every graph that feeds of 1..`widest` tokens run."""
        if self.path.symbolic_shapes:
            return list(range(1, min(widest, SYMBOLIC_FROM) + 1))
        return sorted({self.graph_width(w) for w in range(1, widest + 1)})

    def warm_up(
        self, batch: int, capacity: int, shapes: list[tuple[int, int, bool, int, bool, Post | None]],
        state_layers: tuple[int, ...] = (),
    ) -> None:  # fmt: skip
        """Compile the forwards of `batch` rows for each (width, keep, want_hidden, hidden_rows, features,
        post) in `shapes` now (the states with `state_layers`' outputs), at the capacity a decode of
        `capacity` slots uses; the cache is reset after."""
        self.reset(batch, capacity)
        ids = torch.ones(batch, max([2, *(w for w, *_ in shapes)]), dtype=torch.long, device=self.device)
        read = int(getattr(self.model, "state_width", self.model.config.hidden_size))  # a feature draft's W

        def feed(width: int, keep: int, want: bool, rows: int, feats: bool, post: Post | None) -> None:
            counts = torch.full((batch,), width, device=self.device)
            f = torch.zeros(batch, width, read, device=self.device) if feats else None
            self.feed(ids[:, :width], counts, keep, want, rows, f, post, state_layers if want else ())

        with torch.inference_mode():
            feed(2, 1, False, 1, is_feature_draft(self.model), None)  # a prompt (eager)
            for shape in shapes:
                feed(*shape)
        self.reset(batch, capacity)

    # ---------------------------------------------------------------------------------------- forwards

    def feed(
        self, tokens: torch.Tensor, counts: torch.Tensor, keep: int, want_hidden: bool = False,
        hidden_rows: int | None = None, features: torch.Tensor | None = None, post: Post | None = None,
        state_layers: tuple[int, ...] = (), eager: bool = False,
    ) -> tuple[torch.Tensor | None, ...]:  # fmt: skip
        """`RaggedCache.feed` for the active rows: tokens (R, W) right-aligned, counts (R,); returns logits
        (R, keep, V) and hidden (R, hidden_rows, H or W) or None, or `post`'s outputs (traced into the
        forward's graph; its per-row inputs and outputs span the physical batch inside it). `eager`: run
        uncompiled at the block's own width, as a prompt does (a catch-up wider than any warmed graph)."""
        rows = hidden_rows if hidden_rows is not None else keep
        prefill = (self.used == 0 and tokens.shape[1] > 1) or eager
        pad = 0 if prefill else self.graph_width(tokens.shape[1]) - tokens.shape[1]
        if pad:  # holes on the left; every position's outputs (one graph for every keep), sliced below
            tokens = F.pad(tokens, (pad, 0))
            features = F.pad(features, (0, 0, pad, 0)) if features is not None else None
            keep, hidden_rows, out_keep = (keep, rows, keep) if post is not None else (0, 0, keep)
        width = tokens.shape[1]
        self._make_room(width)
        # Fresh row-major copies: a graph is specialised on its inputs' strides too, and a slice keeps its
        # parent's even where `contiguous()` would not copy it (a (1, 1) slice of a (1, 4) block: (4, 1)).
        row_major = torch.contiguous_format
        tokens, counts = tokens.to(self.device).clone(memory_format=row_major), counts.to(self.device)
        if features is not None:
            features = features.to(self.device).clone(memory_format=row_major)
        fn, per_row, constants = post if post is not None else (None, (), ())
        if len(self.rows) < self.batch:  # finished rows stay in the batch, as holes
            tokens = self._scatter(tokens)
            counts = self._scatter(counts)
            features = self._scatter(features) if features is not None else None
            per_row = tuple(self._scatter(x) if x is not None else None for x in per_row)
        j = torch.arange(width, device=self.device)
        start = width - counts  # (B,) first real slot of each row in this block
        valid = j[None, :] >= start[:, None]  # (B, W)
        positions = (self._length[:, None] + j[None, :] - start[:, None]).clamp_min(0)
        self._mask[:, self.used : self.used + width] = valid
        rows_in = hidden_rows if hidden_rows is not None else keep
        # 0 = every position: the symbolic graph must not specialise on the width through them
        keep_arg, rows_arg = (0 if keep in (0, width) else keep), (0 if rows_in in (0, width) else rows_in)
        layers = tuple(state_layers)
        args = (self.model, self.cache, tokens, self._mask, positions, features, keep_arg, want_hidden,
                rows_arg, layers, fn, *per_row, *constants)  # fmt: skip
        if not self.compile or prefill:
            out = ragged_forward(*args, windows=self.windows)
        else:
            if self.path.symbolic_shapes:
                symbolic = width >= SYMBOLIC_FROM
            else:  # past the ladder, symbolic on the CPU; a static graph each for the `cudagraphs` backend
                symbolic = width > VERIFY_WIDTHS[-1] and not self.path.on
            if symbolic:
                for t in (tokens, positions) + ((features,) if features is not None else ()):
                    torch._dynamo.mark_dynamic(t, 1, min=SYMBOLIC_FROM, max=MAX_SYMBOLIC_COUNT)
            const_keys = tuple(map(arg_key, constants))
            key = (self.batch, "sym" if symbolic else width, keep_arg, want_hidden, rows_arg, layers,
                   self.capacity, features is not None, fn, *map(arg_key, per_row), *const_keys)  # fmt: skip
            if state_layers:
                install_output_hooks(self.model)
            # the unit: the batch size, the step function and its non-tensor constants (the step rule)
            unit = (self.batch, fn, *(k for c, k in zip(constants, const_keys, strict=True)
                                      if not isinstance(c, torch.Tensor)))  # fmt: skip
            call = self._calls.get(unit)
            if call is None:
                call = self._calls[unit] = compile_units(
                    ragged_forward, self.path, regions_for(self.model, self.path.regional)
                )
            out = call(key, *args, windows=self.windows)
            if self.path.copy_outputs:
                out = copy_out(out)
        self.used += width
        self._length = self._length + counts
        if pad and post is None:  # the positions asked for
            logits, hidden = out
            out = (logits[:, -out_keep:], hidden[:, -rows:] if hidden is not None else None)
        if len(self.rows) < self.batch:  # the active rows of every per-row output
            out = tuple(x[self.rows] if isinstance(x, torch.Tensor) and x.dim() else x for x in out)
        return out

    def _scatter(self, x: torch.Tensor) -> torch.Tensor:
        """Active rows' (R, ...) values into (B, ...) zeros (finished rows: holes)."""
        full = x.new_zeros(self.batch, *x.shape[1:])
        full[self.rows] = x
        return full

    def rollback(self, length: torch.Tensor) -> None:
        """Keep the first `length[r]` tokens of each active row ((R,) int64): a mask update, no copy."""
        full = self._length.clone()
        full[self.rows] = length.to(self.device)
        used = self._mask[:, : self.used]
        rank = used.long().cumsum(1)  # 1-based index of each valid slot within its row
        self._mask[:, : self.used] = used & (rank <= full[:, None])
        self._length = torch.minimum(self._length, full)

    def select(self, rows: torch.Tensor) -> None:
        """Keep the active rows `rows` ((R',) int64 indices into the active rows, in that order); the others
        become all-hole rows of the same physical batch."""
        keep = self.rows[rows.to(self.device)]
        gone = torch.ones(self.batch, dtype=torch.bool, device=self.device)
        gone[keep] = False
        self._mask[gone] = False
        self._length = torch.where(gone, 0, self._length)
        self.rows = keep

    # ------------------------------------------------------------------------------------ compaction

    def _make_room(self, width: int) -> None:
        """Room for `width` more slots: compact (each row's valid slots gathered to the left), and grow the
        cache only when the longest row plus the block does not fit."""
        if self.used + width <= self.capacity:
            return
        longest = int(self._length.max()) if self.batch else 0
        self._compact(longest)
        if longest + width > self.capacity:
            self._grow(longest + width)

    def _compact(self, longest: int) -> None:
        used = self.used
        slot = torch.arange(used, device=self.device)
        # Sort key: valid slots first in their order, then holes; the first `longest` entries stay.
        order = torch.where(self._mask[:, :used], slot, used + slot)
        idx = order.argsort(dim=1, stable=True)[:, :longest]  # (B, longest)
        with torch.inference_mode():
            for layer in self.cache.layers:
                for kv in (layer.keys, layer.values):  # (B, heads, C, d), written in place
                    index = idx[:, None, :, None].expand(-1, kv.shape[1], -1, kv.shape[3])
                    kv[:, :, :longest] = kv[:, :, :used].gather(2, index)
        valid = self._mask[:, :used].gather(1, idx)
        self._mask.zero_()
        self._mask[:, :longest] = valid
        self._crop_to(longest)

    def _grow(self, slots: int) -> None:
        """A cache of at least `slots` (doubled): the used slots copied through the public `update`."""
        old, used = self.cache, self.used
        capacity = _rounded(max(slots, 2 * self.capacity))
        self._alloc(self.batch, capacity)
        self.capacity = capacity
        with torch.inference_mode():
            for idx, layer in enumerate(old.layers):
                self.cache.update(layer.keys[:, :, :used], layer.values[:, :, :used], idx)
        mask = torch.zeros(self.batch, capacity, dtype=torch.bool, device=self.device)
        mask[:, : self._mask.shape[1]] = self._mask
        self._mask, self.used = mask, used


# One compiled cache per (model, device path): every batched decoder of a model shares its graphs.
_SHARED: weakref.WeakKeyDictionary[PreTrainedModel, dict[DevicePath, StaticRaggedCache]] = (
    weakref.WeakKeyDictionary()
)


def ragged_cache(
    model: PreTrainedModel, compile: bool = True, device_path: bool | DevicePath | None = None
) -> StaticRaggedCache:
    """The `StaticRaggedCache` of `model`: one per model and device path, shared by every batched decoder
    of that model (its graphs serve all; a decode resets it first), as `model_runner.make_runner` shares a
    `StaticRunner`. `compile=False` (tests) gets a private one."""
    if not compile:
        return StaticRaggedCache(model, compile=False, device_path=device_path)
    path = DevicePath.resolve(model.device, device_path)
    caches = _SHARED.setdefault(model, {})
    if path not in caches:
        caches[path] = StaticRaggedCache(model, device_path=path)
    return caches[path]
