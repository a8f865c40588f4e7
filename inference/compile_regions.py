"""Regional compilation: a decoder's repeated layers compiled once per unit, not once per layer.

A fast-path unit (`acchead.inference.static_runner.step_forward`) is one graph over the whole model, and
Inductor compiles every decoder layer in it as new code: on a 2-core CPU a 30-layer target's unit took
80-114 s from an empty Inductor cache and 19-25 s from a warm one, once per token count it verifies
(docs/speed.md). The layers are the same code with other weights and other cache tensors, so
`torch.compiler.nested_compile_region` can stand for each of them: dynamo traces the layer as a subgraph
(`invoke_subgraph`) whose weights and cache tensors are its inputs, and Inductor compiles that subgraph
once and calls it per layer.

The mark is a function set as each layer's `forward` for exactly as long as a unit compiles
(`marked_regions`): outside a compile the model is the caller's, untouched (eager calls, other compiled
code, pickling). A graph traced with the marks computes what the unmarked model computes (the marked
`forward` calls the class's own); the decoders replay it with dynamo's guards skipped
(`acchead.inference.compiled_units`), and a call that must compile again marks the layers again first.

What it costs: Inductor's C++ wrapper cannot call a subgraph, so a regional unit runs its kernels from
Python, 40-50 µs more per layer and step, which a narrow layer does not hide. Measured on a 2-core CPU, 1
thread (docs/speed.md): SmolLM2's 30 layers of 3.5M parameters compiled a unit in 19-23 s instead of 80-114
s cold, at a step time 0.92-1.11x the whole graph's (geometric mean 1.008x); the demo target's 21 layers of
0.32M in 14-19 s instead of 50-70 s, but each step 1.09-1.15x slower. So by default (`regional=None` of
`DevicePath`) only layers of at least `MIN_REGION_LAYER_PARAMS` parameters (about their multiply-adds per
token) are marked.

Where it is never used: torch releases without `nested_compile_region` (older ones), models with one
layer (a draft; nothing is reused), layers whose `forward` the instance already overrides (hooks such as
accelerate's device maps, which the mark would bypass), and the device path, where it has not run on a
GPU yet.
"""

from __future__ import annotations

import contextlib
import functools
import types
import weakref
from collections.abc import Callable, Iterator

import torch
from torch import nn

# By default a layer is compiled as a region from this many parameters up: between the demo target's 0.32M
# (its regional steps ran 1.09-1.15x slower) and SmolLM2's 3.5M (level), measured (module docstring).
MIN_REGION_LAYER_PARAMS = 1 << 20

# None in torch releases without it (every unit then compiles as one graph).
_NESTED = getattr(torch.compiler, "nested_compile_region", None)


def decoder_layers(model: nn.Module, min_params: int = MIN_REGION_LAYER_PARAMS) -> list[nn.Module] | None:
    """The decoder's layers if regional compilation may mark them: two or more modules of one class in the
    decoder's `layers` (transformers' public `get_decoder()`), none with a `forward` of its own instance,
    each of at least `min_params` parameters; else None."""
    get_decoder = getattr(model, "get_decoder", None)
    decoder = get_decoder() if callable(get_decoder) else None
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, nn.ModuleList) or len(layers) < 2:
        return None
    if len({type(layer) for layer in layers}) != 1 or any("forward" in vars(layer) for layer in layers):
        return None
    if sum(p.numel() for p in layers[0].parameters()) < min_params:
        return None
    return list(layers)


@functools.cache
def _region(cls: type[nn.Module]) -> Callable:
    """One marked function for every layer of class `cls` (dynamo reuses a region by its function)."""
    forward = cls.forward

    def layer_forward(self, *args, **kwargs):
        return forward(self, *args, **kwargs)

    return _NESTED(layer_forward)


@contextlib.contextmanager
def marked_regions(layers: list[nn.Module]) -> Iterator[None]:
    """Each of `layers` (one class; `decoder_layers`) runs as a compile region while the block runs; its
    `forward` is the class's again afterwards, whatever the block raised."""
    region = _region(type(layers[0]))
    for layer in layers:
        layer.forward = types.MethodType(region, layer)
    try:
        yield
    finally:
        for layer in layers:
            vars(layer).pop("forward", None)


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
