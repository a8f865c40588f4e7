"""Regional compilation: a decoder's repeated layers traced and compiled once per unit, not once per layer.

A fast-path unit (`acchead.inference.static_runner.step_forward`) is one graph over the whole model, and
Inductor compiles every decoder layer in it as new code: on a 2-core CPU a 30-layer target's unit took
80-114 s from an empty Inductor cache and 19-25 s from a warm one, once per token count it verifies
(docs/speed.md). The layers are the same code with other weights and other cache tensors, so
`torch.compiler.nested_compile_region` can stand for each of them: dynamo traces the layer as a subgraph
(`invoke_subgraph`) whose weights and cache tensors are its inputs, Inductor compiles that subgraph once
and calls it per layer, and dynamo itself reuses the traced layer for the others where it may:

- every input of the region must be a tensor, a number or a module, so the region is given the layer's
  cache tensors, not the cache (`_LayerSlot`, which runs transformers' own `StaticLayer.update` on them);
- the region must have no side effect: transformers' Llama attention sits under the `kernels` package's
  `use_kernelized_func` wrapper, which sets a context variable on every call, so while a unit compiles a
  module nobody kernelized runs the forward under that wrapper (`_unwrapped_forward`);
- the weights must be inputs, not constants: Inductor's weight freezing makes them constants (dynamo then
  fails to map them to the reused layer's), so no unit compiles with freezing
  (`acchead.inference.compiled_units`).

The marks are functions set as each layer's `forward` (and the unwrapped attention's) for exactly as long
as a unit compiles (`marked_regions`): outside a compile the model is the caller's, untouched (eager
calls, other compiled code, pickling). A graph traced with the marks computes what the unmarked model
computes (the marked `forward` calls the class's own); the decoders replay it with dynamo's guards skipped
(`acchead.inference.compiled_units`), and a call that must compile again marks the layers again first.

What it costs: Inductor's C++ wrapper cannot call a subgraph, so a regional unit runs its kernels from
Python, 40-50 µs more per layer and step, which a narrow layer does not hide. Measured on a 2-core CPU, 1
thread (docs/speed.md): SmolLM2's 30 layers of 3.5M parameters, each layer traced anew, compiled a unit in
19-23 s instead of 80-114 s cold, at a step time 0.92-1.11x the whole graph's (geometric mean 1.008x);
with one traced layer reused, 12-19 s cold and 6-7 s from a warm cache (13-15 s before), each step
1.011-1.013x the frozen, per-layer-traced units' (two runs); the demo target's 21 layers of 0.32M in
14-19 s instead of 50-70 s, but each step 1.09-1.15x slower. So by default (`regional=None` of
`DevicePath`) only layers of at least `MIN_REGION_LAYER_PARAMS` parameters (about their multiply-adds per
token) are marked.

A model of one layer (the real pair's feature draft) has nothing to reuse: its units compile whole, with
Inductor's C++ wrapper, as a narrow model's do.

Where it is never used: torch releases without `nested_compile_region` (older ones), layers whose
`forward` the instance already overrides (hooks such as accelerate's device maps, which the mark would
bypass) or that read another layer's cache, and the device path, where it has not run on a GPU yet. A
layer whose cache is not a full-attention `StaticLayer` is still a region, traced anew per layer.
"""

from __future__ import annotations

import contextlib
import functools
import types
import weakref
from collections.abc import Callable, Iterator

import torch
from torch import nn
from transformers.cache_utils import StaticLayer

from acchead.cache_keyword import CACHE_ARG

# By default a layer is compiled as a region from this many parameters up: between the demo target's 0.32M
# (its regional steps ran 1.09-1.15x slower) and SmolLM2's 3.5M (level), measured (module docstring).
MIN_REGION_LAYER_PARAMS = 1 << 20

# None in torch releases without it (every unit then compiles as one graph).
_NESTED = getattr(torch.compiler, "nested_compile_region", None)


def decoder_layers(model: nn.Module, min_params: int = MIN_REGION_LAYER_PARAMS) -> list[nn.Module] | None:
    """The decoder's layers if regional compilation may mark them: two or more modules of one class in the
    decoder's `layers` (transformers' public `get_decoder()`), alike but for their weights and index
    (`_baked`), none with a `forward` of its own instance,
    each of at least `min_params` parameters and reading the cache's layer at its own position (the
    `layer_idx` of its modules, where they have one: a region is given that layer of the cache); else
    None."""
    layers = _layer_list(model)
    if layers is None or len(layers) < 2:
        return None
    if len({type(layer) for layer in layers}) != 1 or any("forward" in vars(layer) for layer in layers):
        return None
    if sum(p.numel() for p in layers[0].parameters()) < min_params:
        return None
    if any(getattr(m, "layer_idx", i) != i for i, layer in enumerate(layers) for m in layer.modules()):
        return None
    if len({_baked(layer) for layer in layers}) != 1:
        # Layers that differ in more than their weights (Gemma 2's sliding and full attention, SmolLM3's
        # layers without rotary positions) compile whole: dynamo's reuse does not always see it (it ran a
        # Gemma 2's full layers on a sliding one's trace, logits 0.2-0.7 off; it told SmolLM3's apart),
        # fiftieth session, tests/test_architectures.py.
        return None
    return list(layers)


def _baked(layer: nn.Module) -> tuple:
    """What a traced layer bakes in beside its weights: each of its modules' plain attributes (numbers,
    strings, flags: a window, whether it applies rotary positions), its own index aside."""
    return tuple(
        (name, key, value)
        for name, module in layer.named_modules()
        for key, value in sorted(vars(module).items())
        if key != "layer_idx" and isinstance(value, bool | int | float | str | None)
    )


def _layer_list(model: nn.Module) -> nn.ModuleList | None:
    """The decoder's `layers` (transformers' public `get_decoder()`), or None where it has none."""
    get_decoder = getattr(model, "get_decoder", None)
    layers = getattr(get_decoder() if callable(get_decoder) else None, "layers", None)
    return layers if isinstance(layers, nn.ModuleList) else None


class _LayerSlot(StaticLayer):
    """One full-attention layer of a static cache, standing in for the whole cache inside that layer's
    region. Dynamo reuses a traced region only where every input is a tensor, a number or a module, not a
    cache object: so the region takes the layer's cache tensors and builds this around them. The
    attention's `cache.update(k, v, layer_idx, ...)` (`Cache.update`'s signature) runs `StaticLayer.update`,
    transformers' own code, on this layer's tensors."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, length: torch.Tensor) -> None:
        # Not StaticLayer.__init__, which allocates a new length: these are the cache's own tensors.
        self.keys, self.values = keys, values  # (B, kv heads, capacity, head dim) each, written in place
        self.cumulative_length = length  # (): the write position, moved in place
        self.max_cache_len = keys.shape[-2]
        self.device = keys.device
        self.is_initialized = True

    def update(self, key_states, value_states, layer_idx: int | None = None, *args, **kwargs):
        return super().update(key_states, value_states, *args, **kwargs)


def _slot_of(cache: object, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Layer `index`'s key, value and length tensors in `cache` if it is a full-attention `StaticLayer`
    (whose `update` `_LayerSlot` runs), else None."""
    layers = getattr(cache, "layers", None)
    layer = layers[index] if isinstance(layers, list) and index < len(layers) else None
    if layer is None or type(layer).update is not StaticLayer.update or not layer.is_initialized:
        return None
    return layer.keys, layer.values, layer.cumulative_length


@functools.cache
def _region(cls: type[nn.Module]) -> Callable:
    """One marked function for every layer of class `cls` (dynamo reuses a region by its function): the
    class's forward, its cache slot's tensors (`_LayerSlot`) among the inputs; with `slot` None the layer
    reads the cache it was given (traced anew for every layer)."""
    forward = cls.forward

    def layer_forward(self, slot: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None, *args, **kwargs):
        if slot is not None:
            kwargs[CACHE_ARG] = _LayerSlot(*slot)
        return forward(self, *args, **kwargs)

    return _NESTED(layer_forward)


def _marked_forward(region: Callable, index: int) -> Callable:
    """Decoder layer `index`'s forward while marked: its cache slot taken out of the cache argument, then
    the region."""

    def forward(self, *args, **kwargs):
        slot = _slot_of(kwargs.get(CACHE_ARG), index)
        if slot is not None:
            kwargs[CACHE_ARG] = None
        return region(self, slot, *args, **kwargs)

    return forward


def _unwrapped_forward(module: nn.Module) -> Callable | None:
    """The forward under the `kernels` package's `use_kernelized_func` wrapper of `module`'s class, where
    no kernel function of the module is kernelized; else None.

    The wrapper (transformers' Llama attention has one, for its rotary embedding) routes the module's kernel
    functions to its own copies, which `kernels.kernelize` may replace: until it does, each copy calls the
    plain function, so the forward under the wrapper computes the same. But the wrapper sets a context
    variable around every call, a side effect that keeps dynamo from reusing a traced region: while a unit
    compiles, such modules run the forward under it.
    """
    forward = type(module).forward
    code, inner = getattr(forward, "__code__", None), getattr(forward, "__wrapped__", None)
    if code is None or inner is None or code.co_name != "new_forward" or "kernels" not in code.co_filename:
        return None
    funcs = vars(module).get("_kernel_funcs")  # the module's own copies (the package's attribute, read only)
    if not isinstance(funcs, dict) or "forward" in vars(module):
        return None
    if any("forward" in vars(f) for f in funcs.values()):  # kernelized: the copy's forward is replaced
        return None
    return inner


@contextlib.contextmanager
def marked_regions(layers: list[nn.Module]) -> Iterator[None]:
    """Each of `layers` (one class; `decoder_layers`) runs as a compile region while the block runs, and
    its modules under a `kernels` wrapper without it (`_unwrapped_forward`); every `forward` is the class's
    again afterwards, whatever the block raised."""
    region = _region(type(layers[0]))
    plain = [(m, f) for layer in layers for m in layer.modules() if (f := _unwrapped_forward(m)) is not None]
    for index, layer in enumerate(layers):
        layer.forward = types.MethodType(_marked_forward(region, index), layer)
    for module, forward in plain:
        module.forward = types.MethodType(forward, module)
    try:
        yield
    finally:
        for module in (*layers, *(m for m, _ in plain)):
            vars(module).pop("forward", None)


def regions_for(
    model: nn.Module, regional: bool | None = None
) -> Callable[[], contextlib.AbstractContextManager] | None:
    """A context factory that marks `model`'s layers while a unit compiles (`compile_units`' `regions`), or
    None where regional compilation does not apply. `regional`: None decides by the layers' size
    (`decoder_layers`), True marks layers of any size, False never. The factory holds the model weakly,
    as the runners do, and finds its layers when called: once the model is gone it marks nothing."""
    min_params = MIN_REGION_LAYER_PARAMS if regional is None else 0
    if regional is False or _NESTED is None or decoder_layers(model, min_params) is None:
        return None
    model_ref = weakref.ref(model)

    def regions() -> contextlib.AbstractContextManager:
        live = model_ref()
        layers = decoder_layers(live, min_params) if live is not None else None
        return marked_regions(layers) if layers else contextlib.nullcontext()

    return regions
