"""The fast path of `acchead.inference.model_runner`: a preallocated `StaticCache` and compiled forwards.

`StaticRunner` runs one causal LM (batch size 1) over a transformers `StaticCache` of fixed capacity,
preallocated once, so rolling back is moving the write position (stale keys past it are masked by the
causal mask and overwritten by the next write); and every unit (a forward of a given token count with
the decoder's work on its output, `feed(..., post=...)`; `acchead.inference.units`) is compiled once
with `torch.compile` (`fullgraph`, static shapes) and replayed: on CUDA as a CUDA graph
(`mode="reduce-overhead"`), on the CPU as Inductor's fused C++ kernels with the weights as inputs, stored
on disk the first time (`acchead.inference.unit_store`: a later process loads it rather than compiling it
again; docs/speed.md); a wide model's decoder layers compile as regions there, one layer traced and
compiled for all of them (`acchead.inference.compile_regions`). The prompt (a new length every call) runs
eager on the same cache.

Why one compiled graph per token count: a round verifies L + 1 tokens, L chosen online, and a captured
graph has fixed shapes. The decoders use few counts (1 and 2 for a draft; 1..cap + 1 for the target), so
they are compiled lazily, each the first time it is needed. Dynamo's recompile limits (8 per frame, 256 in
all) would make the later ones fall back to eager: they are raised only around the calls that compile,
with `torch._dynamo.config.patch`, so the process's own settings are never changed.

Only transformers' public cache API is used: the write position moves back through `StaticCache.crop`
(transformers >= 5.4 keeps it per layer as a tensor updated in place, so a captured graph that reads it
stays valid) and a grown cache is refilled through `StaticCache.update`; caches whose position cannot be
rolled back are refused with one line. Releases whose full-attention `StaticLayer` has no `crop` (5.4-5.23;
the GPU image's 5.17 is one: the fast path refused it there, 2026-11-26) get our own `RollbackStaticLayer`,
a subclass that adds the `crop` 5.24 ships, in the cache's public `layers`; a sliding-window layer is built
as a full one (`new_static_cache`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Literal

import torch
from transformers import PreTrainedModel, StaticCache
from transformers.cache_utils import StaticLayer, StaticSlidingWindowLayer

from acchead.errors import AccheadError
from acchead.feature_chain import install_output_hooks, target_states
from acchead.inference.compile_regions import regions_for
from acchead.inference.compiled_units import arg_key, compile_units
from acchead.inference.device_path import DevicePath
from acchead.lm_forward import head_logits, splits_cleanly
from acchead.models import CACHE_ARG

# The upper bound of a symbolic token count (a bound is needed with a lower one: torch 2.13's
# `mark_dynamic(min=...)` fails on max=None).
MAX_SYMBOLIC_COUNT = 1 << 16

# Static caches are sized in multiples of this many tokens: few distinct sizes (each compiles its own
# graphs), yet little attention over empty slots (a captured step attends over the whole capacity).
_CAPACITY_STEP = 128


def step_forward(
    model: PreTrainedModel,
    cache: StaticCache,
    input_ids: torch.Tensor,
    keep: int,
    want_hidden: bool | Literal["all"] | tuple,
    post: Callable | None = None,
    *post_args: Any,
    features: torch.Tensor | None = None,
):
    """One forward over `input_ids` ((1, n)) after the cache, and what the decoder does with its output:
    the unit `torch.compile` captures. `want_hidden`: False, True (the last position's state), "all"
    (every fed position's, (n, H): the states a feature draft reads) or ("all", *layers) (every fed
    position's state followed by those decoder layers' outputs, (n, W): a draft with `fused_layers`).

    Runs the decoder stack and the LM head separately (public `get_decoder` / `get_output_embeddings`).
    `StaticRunner` checks once that this equals the model's own forward. Only fused states ask the stack
    for `output_hidden_states` (transformers collects them with hooks, which a captured graph traces).
    Returns logits (keep, V) (keep = 0: every position's, (n, V)) and the final hidden state (H,) of the
    last position (or None); with `post`,
    `post(logits, hidden, model, cache, *post_args)` instead, traced into the same graph (a draft step's
    sampling and stop rule, a verification's acceptance and next token: `acchead.inference.units`).
    `features`: the model is a feature draft and these (1, n, W) are the states its pairs read.
    """
    fused = tuple(want_hidden[1:]) if isinstance(want_hidden, tuple) else ()
    if features is not None:  # a feature draft (`acchead.feature_draft`): (1, n, W) states beside the ids
        states = model.hidden_states(input_ids, features, **{CACHE_ARG: cache}, use_cache=True)  # (1, n, H)
    else:
        states = target_states(model, fused, input_ids=input_ids, **{CACHE_ARG: cache}, use_cache=True)
    hidden = states[0, :, : model.config.hidden_size]  # (n, H): the final states
    rows = hidden[-keep:] if keep else hidden  # (keep or n, H): what the LM head reads
    logits = head_logits(model, rows)  # (keep or n, V); on the CPU as W·hᵀ (few rows: acchead.lm_forward)
    last = states[0] if want_hidden == "all" or fused else rows[-1] if want_hidden else None
    return (logits, last) if post is None else post(logits, last, model, cache, *post_args)


class RollbackStaticLayer(StaticLayer):
    """A full-attention `StaticLayer` with the `crop` of later transformers releases, for those without it:
    moving the write position back in place (stale keys past it are masked, then overwritten)."""

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise RuntimeError("a static layer is cropped by a negative count: the tokens to remove")
        self.cumulative_length.sub_(-tokens_to_remove)  # in place: a captured graph reads this tensor


def new_static_cache(config, capacity: int) -> StaticCache:
    """A `StaticCache` of `capacity` tokens whose every attention layer is a full-attention layer that can
    `crop` (see the module docstring).

    A sliding-window layer (Mistral's, Gemma 2's and 3's local layers) is a buffer of the window alone: once
    a sequence passes the window it rolls old states out, which a rollback cannot bring back, and it keeps
    its length as a Python int, which a compiled graph would bake in. Each is built as a full layer of the
    whole capacity instead; the model's own mask still applies the window, as on the eager path
    (`acchead.kv_decode`'s `DynamicCache()`). A sliding layer of another kind is refused in one line."""
    cache = StaticCache(config=config, max_cache_len=capacity)
    full = StaticLayer if hasattr(StaticLayer, "crop") else RollbackStaticLayer
    # the layers are allocated lazily, at the first update: swapping them now loses nothing
    cache.layers = [
        full(max_cache_len=capacity) if type(layer) in (StaticLayer, StaticSlidingWindowLayer) else layer
        for layer in cache.layers
    ]
    if any(getattr(layer, "is_sliding", False) for layer in cache.layers):
        raise AccheadError(
            f"the fast path cannot roll back the sliding-window cache layers of {type(config).__name__} "
            "(no full-attention form of them): use fast=False"
        )
    return cache


class StaticRunner:
    """The fast path: a preallocated `StaticCache` and one compiled forward per (token count, outputs).

    Create it through `make_runner`, which gives every decoder of a model the same one: compiled graphs
    are bound to this runner's cache, so two compiled runners of one model must not coexist. The runner
    refers to its model weakly (`model` is None once the model is freed): `make_runner`'s registry is
    keyed by the model, and a strong reference from its value would keep the model alive forever.

    Args:
        model: the causal LM (eval mode). Its compiled graphs are bound to this runner's cache:
            replacing the model's weights afterwards needs a new runner.
        capacity: tokens the cache holds, rounded up to a multiple of `_CAPACITY_STEP`; `reset`
            and `feed` grow it when a sequence needs more (the cached keys/values are copied), which
            recompiles: a decoder's `warm_up` with the longest sequence first keeps that out of timed
            decoding.
        compile: False runs the static cache eagerly (no capture): the same cache logic, testable in
            seconds; the decoders' fast path compiles.
        device_path: compile the units as the CUDA default does (`acchead.inference.device_path`: graph
            replay, weights not frozen, outputs copied out); None: on CUDA only; a `DevicePath` also
            picks its compile backend.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        capacity: int = 256,
        compile: bool = True,
        device_path: bool | DevicePath | None = None,
    ) -> None:
        self._model = weakref.ref(model)
        self.device: torch.device = model.device
        self.path = DevicePath.resolve(self.device, device_path)
        self.compile = compile
        self.capacity = 0
        self.length = 0
        self.cache: StaticCache | None = None
        self._compiled: Callable | None = None
        self._alloc(capacity)

    @property
    def model(self) -> PreTrainedModel:
        """The causal LM (held weakly: see the class docstring)."""
        return self._model()

    # ------------------------------------------------------------------------------------------- cache

    def _alloc(self, capacity: int, keep: int = 0) -> None:
        """A new cache of `capacity` (rounded up) tokens holding the first `keep` positions of the old one."""
        capacity = -(-capacity // _CAPACITY_STEP) * _CAPACITY_STEP
        limit = getattr(self.model.config, "max_position_embeddings", None)
        if limit:
            capacity = min(capacity, int(limit))
        old = self.cache
        self.cache = new_static_cache(self.model.config, capacity)
        # Allocate the key/value tensors now, on the model's device and dtype, so that their addresses
        # never change (a captured graph reads them in place); and check, once, that the decoder stack
        # plus LM head that `step_forward` runs is the model's forward (`acchead.lm_forward.splits_cleanly`:
        # no logit scaling or soft-capping after the head, which some architectures add).
        draft_states = self._zero_features(1)  # a feature draft's forward reads states beside the ids
        if old is None and draft_states is None and not splits_cleanly(self.model):
            raise AccheadError(
                f"{type(self.model).__name__}: its logits are not the LM head of the decoder's last "
                "hidden state, which the fast path computes; use fast=False"
            )
        with torch.inference_mode():
            ids = torch.ones(1, 1, dtype=torch.long, device=self.device)
            step_forward(self.model, self.cache, ids, 1, False, features=draft_states)
            self._empty_new_cache(check=old is None)
            if old is not None and keep:
                # The first `keep` positions, written through the public `update` (it also advances the write
                # position to `keep`).
                for idx, layer in enumerate(old.layers):
                    self.cache.update(layer.keys[:, :, :keep], layer.values[:, :, :keep], idx)
        self.capacity = capacity
        if self._compiled is None and self.compile:
            self._compiled = self._make_compiled()
        self.length = keep

    def _zero_features(self, n: int) -> torch.Tensor | None:
        """(1, n, W) zero states for a feature draft's forward; None for any other model."""
        width = getattr(self.model, "state_width", None)
        return None if width is None else torch.zeros(1, n, width, device=self.device)

    def _empty_new_cache(self, check: bool) -> None:
        """Move the new cache's write position back from 1 (the forward above) to 0 through the public
        `crop`; with `check` (the first cache, built before any decode: reading the position back is a
        device sync), refuse a cache that cannot: only a position kept as a tensor, updated in place, lets
        a captured graph (which reads it) roll back (transformers >= 5.4)."""
        try:
            self.cache.crop(-1)
            emptied = not check or int(self.cache.get_seq_length()) == 0
        except (NotImplementedError, RuntimeError, ValueError, AttributeError):
            emptied = False
        if not emptied:
            import transformers

            raise AccheadError(
                f"the fast path needs transformers' StaticCache with per-layer write positions that roll "
                f"back (transformers >= 5.4); installed: {transformers.__version__}. Use fast=False"
            )

    def _make_compiled(self) -> Callable:
        """`step_forward` compiled for this runner's device, as a function of the same arguments (one graph
        per token count, outputs and capacity: `compile_units`)."""
        call = compile_units(step_forward, self.path, regions_for(self.model, self.path.regional))

        def run(model, cache, ids, keep, want_hidden, post, *post_args, features=None):
            # Everything a graph was specialised on: a key seen before may skip the guards.
            key = (ids.shape[1], keep, want_hidden, self.capacity, post, arg_key(features),
                   *map(arg_key, post_args))  # fmt: skip
            return call(key, model, cache, ids, keep, want_hidden, post, *post_args, features=features)

        return run

    def _reserve(self, capacity: int, keep: int) -> None:
        """Room for `capacity` tokens, keeping the first `keep`; one line past the model's context (a
        write past the cache's end would otherwise fail inside a compiled kernel)."""
        if capacity <= self.capacity:
            return
        limit = getattr(self.model.config, "max_position_embeddings", None)
        if limit and capacity > limit:
            raise AccheadError(f"a sequence of {capacity} tokens exceeds the model's context ({limit})")
        self._alloc(capacity, keep)

    def reset(self, capacity: int) -> None:
        self._reserve(capacity, 0)
        self.rollback(0)

    # ----------------------------------------------------------------------------------------- forwards

    def feed(
        self,
        tokens: torch.Tensor,
        keep: int = 1,
        want_hidden: bool = False,
        post: Callable | None = None,
        post_args: tuple = (),
        post_feeds: int = 0,
        all_hidden: bool = False,
        symbolic: int = 0,
        state_layers: tuple[int, ...] = (),
        features: torch.Tensor | None = None,
        eager: bool = False,
    ) -> Any:
        """See `ModelRunner.feed`. `symbolic` > 0: the compiled graph serves every token count n ≥
        `symbolic` (n is a symbol of it, guarded to that range so that it never shadows the static graphs
        of smaller counts; the caller marks the matching dimensions of `post_args` with
        `torch._dynamo.mark_dynamic`, and passes keep = 0, every position, rather than a constant n)."""
        if all_hidden:  # a graph of its own (the key holds want_hidden)
            want_hidden = ("all", *state_layers) if state_layers else "all"
        n = tokens.numel()
        self._reserve(self.length + n + post_feeds, self.length)
        ids = tokens.to(self.device)[None]
        # The prompt (a new length every call) runs eager; decode-time counts replay their graph.
        uncompiled = eager or (self.length == 0 and n > 1)
        fn = step_forward if self._compiled is None or uncompiled else self._compiled
        if state_layers and fn is not step_forward:
            install_output_hooks(self.model)
        feats = features.to(self.device)[None] if features is not None else None  # (1, n, W)
        if symbolic and fn is not step_forward:  # (a feature draft's feeds are static: no caller marks them)
            torch._dynamo.mark_dynamic(ids, 1, min=symbolic, max=MAX_SYMBOLIC_COUNT)
        out = fn(self.model, self.cache, ids, keep, want_hidden, post, *post_args, features=feats)
        self.length += n + post_feeds
        if self._compiled is None or uncompiled or not self.path.copy_outputs:
            return out
        return copy_out(out)

    def rollback(self, length: int) -> None:
        if length < self.length:
            # Inference mode: the write positions may be inference tensors, which only it may update in
            # place (transformers 5.17 moves them to the cache's device in its lazy init, i.e. inside the
            # inference-mode forward of `_alloc`, when the model is on CUDA; seen on an H100).
            with torch.inference_mode():
                self.cache.crop(length - self.length)  # public: moves every layer's position back in place
            self.length = length


def copy_out(out: tuple) -> tuple:
    """A graph replay's outputs as tensors of their own: the next replay overwrites its output buffers."""
    return tuple(x.clone() if isinstance(x, torch.Tensor) else x for x in out)
