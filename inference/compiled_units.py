"""Compiled units: a function compiled once per key, each seen key replayed with dynamo's guards skipped.

The fast path's runners (`acchead.inference.static_runner`, `static_ragged_cache`) compile `step_forward`
and its variants once per token count, output and stop-rule variant: a *unit*. `compile_units` keeps a
unit's bookkeeping: the key of everything its graph was specialised on (`arg_key` of each argument, and the
process-wide settings dynamo guards every graph on, `global_state`), dynamo's recompile limits raised only
around the calls that compile, Inductor's CPU options, and `skip_guard_eval_unsafe` on calls whose key was
seen. A seen key whose graph must compile again all the same (something outside the key changed: dynamo
raises before it runs anything) is compiled with every guard evaluated, never an error. Every unit
goes through the store of compiled units (`acchead.inference.unit_store`) on the CPU: a later process
loads it in ~0.1-0.6 s rather than tracing it again (5-15 s with Inductor's cache warm).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import time
import types
from collections.abc import Callable, Hashable
from typing import Any

import torch

from acchead.inference.device_path import DevicePath
from acchead.inference.unit_store import UnitStore, tensor_key

log = logging.getLogger(__name__)

# Compiled graphs of `step_forward` per process: a unit per token count a decoder can ask for (cap <= 63),
# per S, verifier and stop-rule variant, with room to spare; dynamo's limits are raised to this while a new
# unit compiles (never lowered below the user's).
_RECOMPILE_LIMIT = 2048


def _skip_guards_stance() -> Callable | None:
    """`torch.compiler.set_stance(skip_guard_eval_unsafe=True)` as a context factory; None (torch < 2.7)."""
    set_stance = getattr(torch.compiler, "set_stance", None)
    if set_stance is None or "skip_guard_eval_unsafe" not in inspect.signature(set_stance).parameters:
        return None
    return functools.partial(set_stance, "default", skip_guard_eval_unsafe=True)


_SKIP_GUARDS = _skip_guards_stance()


def arg_key(arg: Any) -> Hashable:
    """What tells two calls' extra arguments apart for the compiled-graph bookkeeping: a tensor's
    properties that dynamo's tensor guard checks (`tensor_key`), any other argument itself (a constant the
    graph was traced with)."""
    if isinstance(arg, torch.Tensor):
        return ("tensor", *tensor_key(arg))
    try:
        hash(arg)
    except TypeError:
        return _Identity(arg)
    return arg


class _Identity:
    """An unhashable argument keyed by identity, held: a bare `id` could be reused by a later object."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Identity) and other.obj is self.obj


def global_state() -> Hashable:
    """The process-wide settings that dynamo's global-state guard checks before every graph and that a user
    may change between decodes (threads, grad mode, deterministic algorithms, default dtype, autocast), read
    through public API: a unit seen under other settings is a graph of its own. (The full suite once ran a
    seen unit after another test had changed the thread count: with its guards skipped, dynamo raised.)"""
    return (
        torch.get_num_threads(), torch.is_grad_enabled(), torch.are_deterministic_algorithms_enabled(),
        torch.get_default_dtype(), torch.is_autocast_enabled("cpu"), torch.is_autocast_enabled("cuda"),
    )  # fmt: skip


def _own_frame(fn: Callable) -> Callable:
    """A copy of `fn` with a code object of its own. Dynamo keeps compiled graphs per code object, and a
    call is served by the first cached graph whose guards pass: one copy per runner keeps a target's
    graphs (some symbolic in the token count) and its draft's from serving, or shadowing, each other."""
    code = fn.__code__.replace()  # a new code object, equal in everything but identity
    return types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def compile_units(
    fn: Callable, path: DevicePath, regions: Callable[[], contextlib.AbstractContextManager] | None = None
) -> Callable[..., Any]:
    """`fn` compiled for `path` (`fullgraph`, static shapes), called as `call(key, *args)`: `key` names
    everything the graph of these arguments is specialised on (shapes, constants, the cache's size).
    `regions`: a context that marks the model's repeated layers while a unit compiles (regional
    compilation, `acchead.inference.compile_regions.regions_for`), off the device path only.

    The first call with a key compiles, with dynamo's recompile limits raised around that call only (the
    process's own settings are left as they are) and, on the CPU, Inductor's C++ wrapper (not for a
    regional unit: see below), the weights graph inputs, never frozen. Later calls with a seen key skip
    dynamo's guard evaluation (0.5 ms of a 5.9 ms target step on the CPU, measured): the guards that tell
    the graphs apart (input shapes, the constants, the cache's size) are still checked, the others (the
    model's parameters) cannot change between calls (`skip_guard_eval_unsafe`; torch >= 2.7, else every
    guard runs). On the CPU a unit is loaded from the store of compiled units where an earlier process
    stored it, else captured ahead of time and stored (`UnitStore.unit`; it runs without guards, under its
    key as here).
    """
    import torch._dynamo
    import torch._inductor.config as inductor_config

    # Static shapes. Automatic dynamic shapes (one graph symbolic in the token count) cut SpecDec++'s
    # warm-up 4x, but which graph serves a call then depends on every unit compiled before it in the
    # process: the full suite saw decodes compile after a complete warm-up (docs/speed.md, issue 32).
    # `symbolic` feeds mark their token count dynamic (`torch._dynamo.mark_dynamic`), which dynamic=False
    # still honours: one graph for the longer verifications, static shapes everywhere else.
    settings = {**path.compile_options, "fullgraph": True, "dynamic": False}
    compiled = torch.compile(_own_frame(fn), **settings)
    # A CPU unit's weights are inputs, not constants: a later process may load it from the store.
    store = UnitStore.default() if not path.on else None
    stored: dict[Hashable, Callable] = {}  # key -> a unit the store loaded or captured
    dynamo = torch._dynamo.config

    def limits() -> contextlib.AbstractContextManager:
        return dynamo.patch(
            recompile_limit=max(dynamo.recompile_limit, _RECOMPILE_LIMIT),
            accumulated_recompile_limit=max(dynamo.accumulated_recompile_limit, _RECOMPILE_LIMIT),
        )

    compiling = limits
    if not path.on:
        # Inductor reads these from its global config when it compiles, so they are set around the call
        # that compiles a new shape. The C++ wrapper drops the Python wrapper's per-kernel overhead
        # (4.3-4.7 instead of 4.9 ms per demo target step). No weight freezing: frozen weights are the
        # graph's constants, which a unit in the store cannot hold (torch 2.13 cannot capture one) and
        # which keep dynamo from reusing one traced layer for the others (compile_regions); unfrozen units
        # with the C++ wrapper ran the demo target's steps 0.945-0.957x the frozen ones' time and the real
        # draft's 0.919-0.946x, measured (docs/speed.md, forty-ninth session). No MKL weight prepacking:
        # its packed tensors cannot be pickled, so every graph bypassed Inductor's on-disk cache.
        # A regional unit goes without the C++ wrapper, which cannot call a subgraph (torch 2.13: "codegen
        # invoke_subgraph is not implemented for cpp wrapper"), and without the Python wrapper's checks of
        # every subgraph input's size and alignment, a cost per layer per step (the units' inputs are
        # static, named by their key); its step time: docs/speed.md.
        inductor = functools.partial(
            inductor_config.patch,
            {"freezing": False, "cpp_wrapper": regions is None, "cpp.weight_prepack": False,
             **({} if regions is None else {"size_asserts": False, "alignment_asserts": False})},
        )
        marks = regions or contextlib.nullcontext

        @contextlib.contextmanager
        def compiling():
            with limits(), inductor(), marks():
                yield

    seen: set[Hashable] = set()

    def call(key: Hashable, *args: Any, **kwargs: Any) -> Any:
        key = (key, global_state())
        unit = stored.get(key)
        if unit is not None:
            return unit(*args, **kwargs)
        if key in seen:
            try:
                with _SKIP_GUARDS() if _SKIP_GUARDS is not None else contextlib.nullcontext():
                    return compiled(*args, **kwargs)
            except RuntimeError as err:
                # A graph for this key would have to compile again: something the key does not name
                # changed (dynamo raises before it runs anything). Evaluate every guard instead.
                if _SKIP_GUARDS is None or "skip_guard_eval_unsafe" not in str(err):
                    raise
                log.debug("%s: unit %s is compiled again: a guard outside its key failed", fn.__name__, key)
        start = time.perf_counter()
        with compiling():
            unit = store.unit(fn, settings, args, kwargs, key[1]) if store is not None else None
            if unit is not None:
                stored[key] = unit
                out = unit(*args, **kwargs)
            else:
                out = compiled(*args, **kwargs)
                seen.add(key)
        log.debug("%s: unit %s ready in %.1f s", fn.__name__, key, time.perf_counter() - start)
        return out

    return call
