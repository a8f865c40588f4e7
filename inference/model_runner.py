"""How a decoder runs one causal LM over a growing sequence: its KV cache, rollback, and (fast path) capture.

Both the target's verification and a draft model's proposals go through a `ModelRunner` (batch size 1):
`feed(tokens)` appends tokens after the cached prefix and returns logits (and the final hidden state);
`rollback(length)` forgets everything after the first `length` tokens (the rejected suffix of a round).

- `EagerRunner`: transformers' `DynamicCache`, rollback through its public `.crop()`. Every forward is
  eager PyTorch, i.e. one kernel launch (GPU) or one dispatch (CPU) per operator of the model.
- `StaticRunner`, the fast path: a transformers `StaticCache` of fixed capacity, preallocated once, so
  rolling back is moving a position (stale keys past it are masked by the causal mask and overwritten by
  the next write); and every unit (a forward of a given token count with the decoder's work on its output,
  `feed(..., post=...)`; `acchead.inference.units`) is compiled once with `torch.compile`
  (`fullgraph`, static shapes) and replayed: on CUDA as a CUDA graph (`mode="reduce-overhead"`), on the
  CPU as Inductor's fused C++ kernels with the weights frozen into the graph (prepacked for MKL, which
  is what makes a one-token forward cheaper than eager's GEMV calls; docs/speed.md).
  The prompt (a new length every call) runs eager on the same cache.

Why one compiled graph per token count: a round verifies L + 1 tokens, L chosen online, and a captured
graph has fixed shapes. The decoders use few counts (1 and 2 for a draft; 1..cap + 1 for the target), so
they are compiled lazily, each the first time it is needed; `torch._dynamo`'s recompile limit is raised so
that none of them falls back to eager.

transformers 5.x keeps each static layer's write position in a `cumulative_length` tensor that advances on
every update (it no longer reads `cache_position`); `rollback` sets it in place, so a captured graph that
reads it stays valid. Caches without that counter (transformers < 5.4) are refused with one line.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Protocol

import torch
from transformers import DynamicCache, PreTrainedModel, StaticCache

from acchead.errors import AccheadError
from acchead.inference.device_path import DevicePath
from acchead.models import CACHE_ARG, final_hidden

# Compiled graphs of `step_forward` per process: a unit per token count a decoder can ask for (cap <= 63),
# per S, verifier and stop-rule variant, with room to spare. Dynamo's defaults (8 per frame, 256 in all)
# would silently fall back to eager past them.
_RECOMPILE_LIMIT = 2048


def _skip_guards_stance() -> Callable | None:
    """`torch.compiler.set_stance(skip_guard_eval_unsafe=True)` as a context factory; None (torch < 2.7)."""
    set_stance = getattr(torch.compiler, "set_stance", None)
    if set_stance is None or "skip_guard_eval_unsafe" not in inspect.signature(set_stance).parameters:
        return None
    return functools.partial(set_stance, "default", skip_guard_eval_unsafe=True)


_SKIP_GUARDS = _skip_guards_stance()

# Static caches are sized in multiples of this many tokens: few distinct sizes (each compiles its own
# graphs), yet little attention over empty slots (a captured step attends over the whole capacity).
_CAPACITY_STEP = 128


class ModelRunner(Protocol):
    """One causal LM over one growing sequence (batch size 1)."""

    model: PreTrainedModel
    length: int  # tokens in the KV cache

    def reset(self, capacity: int) -> None:
        """Start a new sequence that will hold at most `capacity` tokens."""
        ...

    def feed(
        self,
        tokens: torch.Tensor,
        keep: int = 1,
        want_hidden: bool = False,
        post: Callable | None = None,
        post_args: tuple = (),
        post_feeds: int = 0,
    ) -> Any:
        """Append `tokens` ((n,) int64, any device) after the cached prefix.

        Returns, without `post`:
            logits: (keep, V) for the last `keep` positions, on the model's device.
            hidden: (H,) the final hidden state at the last position if `want_hidden`, else None.
        With `post`: `post(logits, hidden, model, cache, *post_args)`, run in the same unit as the forward
        (the fast path compiles them together; `post` must be pure tensor code, its non-tensor arguments
        constants).
        `post_feeds`: tokens `post` itself feeds to the model through `step_forward` and this runner's
        cache (a fixed-K draft round), counted in `length`.
        """
        ...

    def rollback(self, length: int) -> None:
        """Forget everything past the first `length` tokens."""
        ...

    def warm_up(self, counts: Iterable[int], keep_all: bool, hidden: Iterable[bool] = (False,)) -> None:
        """Prepare the forwards of these token counts (the fast path compiles them); resets the sequence."""
        ...


def crop_cache(cache: DynamicCache, length: int) -> None:
    """Crop a transformers cache to its first `length` positions through the public `.crop()`."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)  # negative: the number of tokens to remove (transformers 5)


class EagerRunner:
    """The eager path: a `DynamicCache` cropped on rollback.

    Args:
        model: the causal LM (eval mode, any device/dtype).
    """

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        # Resolved once: `PreTrainedModel.device` walks the parameters on every access.
        self.device: torch.device = model.device
        self.cache = DynamicCache()
        self.length = 0

    def reset(self, capacity: int) -> None:
        self.cache = DynamicCache()
        self.length = 0

    def feed(
        self,
        tokens: torch.Tensor,
        keep: int = 1,
        want_hidden: bool = False,
        post: Callable | None = None,
        post_args: tuple = (),
        post_feeds: int = 0,
    ) -> Any:
        out = self.model(
            input_ids=tokens.to(self.device)[None],
            **{CACHE_ARG: self.cache},
            use_cache=True,
            output_hidden_states=want_hidden,
            logits_to_keep=keep,
        )
        self.length += tokens.numel() + post_feeds
        logits, hidden = out.logits[0, -keep:], final_hidden(out)[0, -1] if want_hidden else None
        return (logits, hidden) if post is None else post(logits, hidden, self.model, self.cache, *post_args)

    def warm_up(self, counts: Iterable[int], keep_all: bool, hidden: Iterable[bool] = (False,)) -> None:
        self.reset(0)  # nothing to compile

    def rollback(self, length: int) -> None:
        crop_cache(self.cache, length)
        self.length = min(self.length, length)


def step_forward(
    model: PreTrainedModel,
    cache: StaticCache,
    input_ids: torch.Tensor,
    keep: int,
    want_hidden: bool,
    post: Callable | None = None,
    *post_args: Any,
):
    """One forward over `input_ids` ((1, n)) after the cache, and what the decoder does with its output:
    the unit `torch.compile` captures.

    Runs the decoder stack and the LM head separately (public `get_decoder` / `get_output_embeddings`),
    because the hidden states `output_hidden_states` returns are collected by hooks that a captured graph
    cannot hold. `StaticRunner` checks once that this equals the model's own forward.
    Returns logits (keep, V) and the final hidden state (H,) of the last position (or None); with `post`,
    `post(logits, hidden, model, cache, *post_args)` instead, traced into the same graph (a draft step's
    sampling and stop rule, a verification's acceptance and next token: `acchead.inference.units`).
    """
    hidden = model.get_decoder()(input_ids=input_ids, **{CACHE_ARG: cache}, use_cache=True).last_hidden_state
    hidden = hidden[0, -keep:]  # (keep, H): after the final norm, what the LM head reads
    logits = model.get_output_embeddings()(hidden)
    last = hidden[-1] if want_hidden else None
    return (logits, last) if post is None else post(logits, last, model, cache, *post_args)


def _arg_key(arg: Any) -> Hashable:
    """What tells two calls' extra arguments apart for the compiled-graph bookkeeping: a tensor's shape and
    dtype (its values are graph inputs), any other argument itself (a constant the graph was traced with)."""
    if isinstance(arg, torch.Tensor):
        return ("tensor", tuple(arg.shape), arg.dtype)
    try:
        hash(arg)
    except TypeError:
        return ("id", id(arg))
    return arg


class StaticRunner:
    """The fast path: a preallocated `StaticCache` and one compiled forward per (token count, outputs).

    Create it through `make_runner`, which gives every decoder of a model the same one: compiled graphs
    are bound to this runner's cache, so two compiled runners of one model must not coexist.

    Args:
        model: the causal LM (eval mode). Its weights are frozen into the compiled graphs on the CPU:
            changing them afterwards needs a new runner.
        capacity: tokens the cache holds, rounded up to a multiple of `_CAPACITY_STEP`; `reset`
            and `feed` grow it when a sequence needs more (the cached keys/values are copied), which
            recompiles: `warm_up` with the longest sequence first keeps that out of timed decoding.
        compile: False runs the static cache eagerly (no capture): the same cache logic, testable in
            seconds; the decoders' fast path compiles.
        device_path: compile the units as the CUDA default does (`acchead.inference.device_path`: graph
            replay, weights not frozen, outputs copied out); None: on CUDA only.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        capacity: int = 256,
        compile: bool = True,
        device_path: bool | None = None,
    ) -> None:
        self.model = model
        self.device: torch.device = model.device
        self.path = DevicePath.resolve(self.device, device_path)
        self.compile = compile
        self.capacity = 0
        self.length = 0
        self.cache: StaticCache | None = None
        self._compiled: Callable | None = None
        self._alloc(capacity)

    # ------------------------------------------------------------------------------------------- cache

    def _alloc(self, capacity: int, keep: int = 0) -> None:
        """A new cache of `capacity` (rounded up) tokens holding the first `keep` positions of the old one."""
        capacity = -(-capacity // _CAPACITY_STEP) * _CAPACITY_STEP
        limit = getattr(self.model.config, "max_position_embeddings", None)
        if limit:
            capacity = min(capacity, int(limit))
        old = self.cache
        self.cache = StaticCache(config=self.model.config, max_cache_len=capacity)
        # Allocate the key/value tensors now, on the model's device and dtype, so that their addresses
        # never change (a captured graph reads them in place); and check, once, that the decoder stack
        # plus LM head that `step_forward` runs is the model's forward (no logit scaling or soft-capping after
        # the head, which some architectures add).
        with torch.inference_mode():
            ids = torch.zeros(1, 1, dtype=torch.long, device=self.device)
            if old is None:
                ref = self.model(input_ids=ids).logits
                ours, _ = step_forward(self.model, self.cache, ids, 1, False)
                if not torch.allclose(ours.float(), ref.float(), rtol=1e-3, atol=1e-3):
                    raise AccheadError(
                        f"{type(self.model).__name__}: its logits are not the LM head of the decoder's last "
                        "hidden state, which the fast path computes; use fast=False"
                    )
            else:
                step_forward(self.model, self.cache, ids, 1, False)
        self._counters = [getattr(layer, "cumulative_length", None) for layer in self.cache.layers]
        if not all(isinstance(c, torch.Tensor) for c in self._counters):
            import transformers

            raise AccheadError(
                f"the fast path needs transformers' StaticCache with per-layer write positions "
                f"(transformers >= 5.4); installed: {transformers.__version__}. Use fast=False"
            )
        if old is not None and keep:
            with torch.inference_mode():  # the cache's tensors were made in inference mode, above
                for new_layer, old_layer in zip(self.cache.layers, old.layers, strict=True):
                    new_layer.keys[:, :, :keep] = old_layer.keys[:, :, :keep]
                    new_layer.values[:, :, :keep] = old_layer.values[:, :, :keep]
        self.capacity = capacity
        if self._compiled is None and self.compile:
            self._compiled = self._make_compiled()
        self._set_length(keep)

    def _make_compiled(self) -> Callable:
        """`step_forward` compiled for this runner's device, as a function of the same arguments.

        Once a (token count, keep, want_hidden, capacity) has been compiled, later calls with it skip
        dynamo's guard evaluation (0.5 ms of a 5.9 ms target step on the CPU, measured): the guards that
        tell this runner's graphs apart (input shapes, the constants, the cache's size) are still
        checked, the others (the model's parameters) cannot change between calls (`skip_guard_eval_unsafe`;
        torch >= 2.7, else every guard runs).
        """
        import torch._dynamo
        import torch._inductor.config as inductor_config

        config = torch._dynamo.config
        config.recompile_limit = max(config.recompile_limit, _RECOMPILE_LIMIT)
        config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, _RECOMPILE_LIMIT)
        mode = self.path.compile_mode
        compiled = torch.compile(step_forward, mode=mode, fullgraph=True, dynamic=False)
        compiling = contextlib.nullcontext
        if not self.path.on:
            # Inductor reads these from its global config when it compiles (passing them in `options=`
            # left the weights unfrozen), so they are set around the call that compiles a new shape:
            # freezing folds the weights into the graph, prepacked for MKL (4.9 instead of 5.6 ms per
            # target step, measured); the C++ wrapper drops the Python wrapper's per-kernel overhead
            # (4.3-4.7 instead of 4.9 ms).
            compiling = functools.partial(inductor_config.patch, freezing=True, cpp_wrapper=True)
        seen: set[tuple] = set()

        def run(model, cache, ids, keep, want_hidden, post, *post_args):
            # Everything a graph was specialised on: a key seen before may skip the guards (below).
            key = (ids.shape[1], keep, want_hidden, self.capacity, post, *map(_arg_key, post_args))
            if key in seen:
                with _SKIP_GUARDS() if _SKIP_GUARDS is not None else contextlib.nullcontext():
                    return compiled(model, cache, ids, keep, want_hidden, post, *post_args)
            with compiling():
                out = compiled(model, cache, ids, keep, want_hidden, post, *post_args)
            seen.add(key)
            return out

        return run

    def _set_length(self, length: int) -> None:
        # Inference mode: the counters may be inference tensors, which only it may update in place
        # (transformers 5.17 moves each counter to the cache's device in its lazy init, i.e. inside the
        # inference-mode forward of `_alloc`, when the model is on CUDA; seen on an H100).
        with torch.inference_mode():
            for counter in self._counters:
                counter.fill_(length)
        self.length = length

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
        self._set_length(0)

    def warm_up(self, counts: Iterable[int], keep_all: bool, hidden: Iterable[bool] = (False,)) -> None:
        """Compile the forward of every token count in `counts` now (with `keep` = count if `keep_all`,
        else 1), once per value in `hidden`; the sequence is reset afterwards."""
        counts = list(counts)
        dummy = torch.zeros(max(counts, default=1), dtype=torch.long)
        for want_hidden in hidden:
            self.reset(self.capacity)
            self.feed(dummy[:1], 1, want_hidden)  # a decode step, not a prefill: length 0 -> 1
            for n in counts:
                self.rollback(1)
                self.feed(dummy[:n], n if keep_all else 1, want_hidden)
        self.reset(self.capacity)

    # ----------------------------------------------------------------------------------------- forwards

    def feed(
        self,
        tokens: torch.Tensor,
        keep: int = 1,
        want_hidden: bool = False,
        post: Callable | None = None,
        post_args: tuple = (),
        post_feeds: int = 0,
    ) -> Any:
        n = tokens.numel()
        self._reserve(self.length + n + post_feeds, self.length)
        ids = tokens.to(self.device)[None]
        # The prompt (a new length every call) runs eager; decode-time counts replay their graph.
        prefill = self.length == 0 and n > 1
        fn = step_forward if self._compiled is None or prefill else self._compiled
        out = fn(self.model, self.cache, ids, keep, want_hidden, post, *post_args)
        self.length += n + post_feeds
        if self._compiled is None or prefill or not self.path.copy_outputs:
            return out
        return copy_out(out)

    def rollback(self, length: int) -> None:
        if length < self.length:
            self._set_length(length)


def copy_out(out: tuple) -> tuple:
    """A graph replay's outputs as tensors of their own: the next replay overwrites its output buffers."""
    return tuple(x.clone() if isinstance(x, torch.Tensor) else x for x in out)


# Where a model keeps its compiled fast-path runner (an attribute of the model object, so the two are freed
# together).
_SHARED_RUNNER = "_acchead_fast_runner"


def make_runner(
    model: PreTrainedModel, fast: bool, compile: bool = True, device_path: bool | None = None
) -> ModelRunner:
    """`EagerRunner`, or for the fast path the model's one compiled `StaticRunner`.

    Every decoder that runs `model` on the fast path shares that runner (decoders take turns: each
    `generate` resets it). This is not only about compiling once: a captured graph is bound to the cache
    it was captured with (Inductor's freezing folds the cache's statically-addressed tensors in on the
    CPU; a CUDA graph records their addresses), and a second cache would silently replay into the first.
    `compile=False` (tests) gets a private runner. `device_path` (None: on CUDA) picks how the units compile
    (`acchead.inference.device_path`); a model's runner serves one choice, another is refused.
    """
    if not fast:
        return EagerRunner(model)
    if not compile:
        return StaticRunner(model, compile=False, device_path=device_path)
    runner = model.__dict__.get(_SHARED_RUNNER)
    if runner is None:
        runner = StaticRunner(model, device_path=device_path)
        model.__dict__[_SHARED_RUNNER] = runner
    elif runner.path != DevicePath.resolve(runner.device, device_path):
        raise AccheadError(
            f"{type(model).__name__} already runs compiled with device_path={runner.path.on}; its graphs "
            "are bound to that runner's cache: load another copy of the model for the other path"
        )
    return runner
