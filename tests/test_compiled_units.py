"""The compiled units' bookkeeping (`acchead.inference.compiled_units`): a key names each graph, a seen key
skips dynamo's guards, and a graph that must compile again all the same is compiled, never an error."""

from __future__ import annotations

import contextlib

import pytest
import torch

from acchead.inference.compiled_units import _SKIP_GUARDS, arg_key, compile_units, global_state
from acchead.inference.device_path import DevicePath

# The `cudagraphs` backend on CPU tensors: dynamo's graphs and guards, run eagerly (compiles in ms).
PATH = DevicePath(on=True, backend="cudagraphs")


def affine(x: torch.Tensor, scale: float) -> torch.Tensor:
    return x * scale + 1


@contextlib.contextmanager
def threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif(_SKIP_GUARDS is None, reason="torch < 2.7: every guard is evaluated anyway")
def test_a_seen_unit_runs_after_the_process_settings_change():
    """The full suite once ran a seen unit after another test had changed the thread count: with the guards
    skipped dynamo raised ("Recompilation triggered with skip_guard_eval_unsafe stance"). Thread count, grad
    mode, deterministic algorithms are part of the key now, and a change outside it compiles again."""
    call = compile_units(affine, PATH)
    x = torch.arange(4.0)
    want = x * 2 + 1
    assert torch.equal(call("unit", x, 2.0), want)
    assert torch.equal(call("unit", x, 2.0), want)  # seen: guards skipped
    with threads(torch.get_num_threads() + 1):
        assert torch.equal(call("unit", x, 2.0), want)
        assert torch.equal(call("unit", x, 2.0), want)
    with torch.no_grad():
        assert torch.equal(call("unit", x, 2.0), want)
    # A setting dynamo guards that the key does not name (TF32 matmuls): the seen key compiles again.
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = not before
    try:
        assert torch.equal(call("unit", x, 2.0), want)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    assert torch.equal(call("unit", x, 2.0), want)


def test_the_key_of_a_tensor_is_what_dynamo_guards_of_it():
    """A tensor made in inference mode, a strided view or one that requires grad each fails dynamo's tensor
    guard of a graph traced on a plain tensor of the same shape: each is a key of its own."""
    call = compile_units(affine, PATH)
    x = torch.arange(4.0)
    with torch.inference_mode():
        frozen = torch.arange(4.0)
    variants = [frozen, torch.arange(8.0)[::2], torch.arange(4.0).requires_grad_()]
    assert len({arg_key(v) for v in [x, *variants]}) == 4
    call(arg_key(x), x, 2.0)
    call(arg_key(x), x, 2.0)
    for v in variants:
        for _ in range(2):
            assert torch.equal(call(arg_key(v), v, 2.0).detach(), v.detach() * 2 + 1)


def test_the_key_tells_settings_and_arguments_apart():
    x = torch.zeros(2, 3)
    assert arg_key(x) == arg_key(torch.ones(2, 3)) != arg_key(torch.ones(3, 2))
    assert arg_key(x) != arg_key(torch.zeros(2, 3, dtype=torch.float64)) != arg_key(torch.zeros(3, 2).t())
    assert arg_key(0.5) == 0.5
    a, b = [1], [1]  # unhashable: keyed by identity, and the key holds the object (its id is never reused)
    assert arg_key(a) == arg_key(a) != arg_key(b)
    assert arg_key(a).obj is a
    state = global_state()
    with threads(torch.get_num_threads() + 1):
        assert global_state() != state
    with torch.no_grad():
        assert global_state() != state
    assert global_state() == state
