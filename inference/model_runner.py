"""How a decoder runs one causal LM over a growing sequence: its KV cache, rollback, and (fast path) capture.

Both the target's verification and a draft model's proposals go through a `ModelRunner` (batch size 1):
`feed(tokens)` appends tokens after the cached prefix and returns logits (and the final hidden state);
`rollback(length)` forgets everything after the first `length` tokens (the rejected suffix of a round).

- `EagerRunner`: acchead's one KV-cached sequence (`acchead.kv_decode.KVSequence`: transformers'
  `DynamicCache`, rollback through its public `.crop()`). Every forward is eager PyTorch, i.e. one
  kernel launch (GPU) or one dispatch (CPU) per operator of the model.
- `StaticRunner` (`acchead.inference.static_runner`), the fast path: a preallocated `StaticCache` and one
  compiled graph per unit, replayed.

`make_runner` picks one; a model's compiled runner is shared by every decoder of that model and kept in
this module's registry, keyed weakly by the model (nothing is stored on the model object).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Protocol

import torch
from transformers import PreTrainedModel

from acchead.errors import AccheadError
from acchead.inference.device_path import DevicePath
from acchead.inference.static_runner import StaticRunner
from acchead.kv_decode import KVSequence


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
        all_hidden: bool = False,
        symbolic: int = 0,
        state_layers: tuple[int, ...] = (),
        features: torch.Tensor | None = None,
        eager: bool = False,
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
        `all_hidden`: `hidden` is (n, H), every fed position's final hidden state (the states a feature
        draft reads, `acchead.inference.feature_drafter`); with `state_layers`, (n, W): each state followed
        by those decoder layers' outputs (a feature draft with `fused_layers`).
        `symbolic` > 0: on the fast path, one compiled graph serves every count n ≥ `symbolic`
        (`StaticRunner.feed`). `keep` = 0 keeps every position. Eager: nothing to do.
        `features` ((n, W)): the model is a feature draft (`acchead.feature_draft`) and these are the states
        its pairs read beside `tokens` (`acchead.inference.feature_drafter`).
        `eager`: on the fast path, run this feed uncompiled, as a prompt's (a width no unit is compiled for).
        """
        ...

    def rollback(self, length: int) -> None:
        """Forget everything past the first `length` tokens."""
        ...


class EagerRunner:
    """The eager path: a `KVSequence` of one row, cropped on rollback.

    Args:
        model: the causal LM (eval mode, any device/dtype).
    """

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.seq = KVSequence(model)
        self.device: torch.device = self.seq.device

    @property
    def cache(self):
        """The transformers cache (a `post` of `feed` receives it)."""
        return self.seq.cache

    @property
    def length(self) -> int:
        return self.seq.length

    def reset(self, capacity: int) -> None:
        self.seq = KVSequence(self.model)

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
        keep = keep or tokens.numel()  # 0: every position
        feats = features[None] if features is not None else None  # (1, n, W)
        logits, hidden = self.seq.feed(tokens[None], keep, want_hidden, all_hidden=all_hidden,
                                       features=feats, state_layers=state_layers)  # fmt: skip
        # Tokens `post` feeds itself (a fixed-K draft round) went through the same cache.
        self.seq.length += post_feeds
        logits, hidden = logits[0], hidden[0] if want_hidden or all_hidden else None
        return (logits, hidden) if post is None else post(logits, hidden, self.model, self.cache, *post_args)

    def rollback(self, length: int) -> None:
        self.seq.crop(length)


# A model's compiled fast-path runner, freed with the model (the runner refers to its model weakly).
_FAST_RUNNERS: weakref.WeakKeyDictionary[PreTrainedModel, StaticRunner] = weakref.WeakKeyDictionary()


def make_runner(
    model: PreTrainedModel, fast: bool, compile: bool = True, device_path: bool | DevicePath | None = None
) -> ModelRunner:
    """`EagerRunner`, or for the fast path the model's one compiled `StaticRunner`.

    Every decoder that runs `model` on the fast path shares that runner (decoders take turns: each
    `generate` resets it). This is not only about compiling once: a captured graph is bound to the cache
    it was captured with (a CUDA graph records its tensors' addresses; on the CPU a seen key skips the guards
    that would tell two caches apart), and a second cache would silently replay into the first.
    `compile=False` (tests) gets a private runner. `device_path` (None: on CUDA) picks how the units compile
    (`acchead.inference.device_path`; a `DevicePath` also picks the compile backend); a model's runner
    serves one choice, another is refused.
    """
    if not fast:
        return EagerRunner(model)
    if not compile:
        return StaticRunner(model, compile=False, device_path=device_path)
    runner = _FAST_RUNNERS.get(model)
    if runner is None:
        runner = StaticRunner(model, device_path=device_path)
        _FAST_RUNNERS[model] = runner
    elif runner.path != DevicePath.resolve(runner.device, device_path):
        raise AccheadError(
            f"{type(model).__name__} already runs compiled with {runner.path}; its graphs "
            "are bound to that runner's cache: load another copy of the model for the other path"
        )
    return runner
