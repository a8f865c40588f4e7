"""The store of compiled units (`acchead.inference.unit_store`): what its digest tells apart, that a later
runner loads a stored unit and runs it on its own weights, and that whatever it cannot store or load falls
back to the usual compilation."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import threading

import pytest
import torch
from conftest import make_tiny_llama

from acchead.inference.device_path import DevicePath
from acchead.inference.static_runner import StaticRunner
from acchead.inference.unit_store import STORE_ENV, UnitStore, Unstable, digest, stable_form

_DIGEST_SCRIPT = """
import sys
sys.path.insert(0, "tests")
from conftest import make_tiny_llama
from acchead.inference.static_runner import new_static_cache
from acchead.inference.unit_store import digest
model = make_tiny_llama(300, hidden_size=64, num_layers=3, seed=1)
def rule(x):
    return x in {"alpha", "beta", "gamma", "delta"}  # a frozenset constant, ordered by string hashes
print(digest(model, new_static_cache(model.config, 64), model.config, rule))
"""


def _digest_in_a_new_process(seed: str) -> str:
    env = {**os.environ, "PYTHONHASHSEED": seed}
    out = subprocess.run([sys.executable, "-c", _DIGEST_SCRIPT], capture_output=True, text=True, env=env,
                         check=True)  # fmt: skip
    return out.stdout.strip().splitlines()[-1]


def test_the_digest_is_the_same_in_every_process_and_tells_apart_what_a_graph_bakes():
    """Equal in two processes of different hash seeds (a model's generation config keeps a hash of itself,
    a set constant's order follows string hashes) and for equal models in one; apart for another config,
    shape, dtype, constant or function; the same for other weights (a regional unit reads them)."""
    assert _digest_in_a_new_process("1") == _digest_in_a_new_process("2")
    a = make_tiny_llama(300, hidden_size=64, num_layers=3, seed=1)
    b = make_tiny_llama(300, hidden_size=64, num_layers=3, seed=2)  # other weights
    b.generation_config._original_object_hash = 12345
    assert digest(a) == digest(b)
    assert digest(a) != digest(make_tiny_llama(300, hidden_size=64, num_layers=2, seed=1))
    assert digest(torch.zeros(2, 3)) != digest(torch.zeros(3, 2)) != digest(torch.zeros(2, 3).double())
    assert digest(torch.zeros(2, 3)) == digest(torch.ones(2, 3))
    assert digest(0.5) != digest(0.25) and digest(1) != digest(True) != digest(1.0)
    assert digest(json.dumps) != digest(json.loads)
    scale = 2.0

    def closure(x):
        return x * scale

    before = digest(closure)
    scale = 3.0
    assert digest(closure) != before


def test_what_the_digest_cannot_describe_is_refused():
    with pytest.raises(Unstable):
        stable_form(threading.Lock())
    cycle: list = []
    cycle.append(cycle)
    assert stable_form(cycle) == ("list", (("cycle", 0),))


def _feeds(runner: StaticRunner, prompt: torch.Tensor, steps: list[torch.Tensor]) -> list[torch.Tensor]:
    runner.reset(64)
    runner.feed(prompt)
    return [runner.feed(tokens, keep=len(tokens))[0].clone() for tokens in steps]


@torch.inference_mode()
def test_a_later_runner_loads_the_stored_units_and_runs_them_on_its_own_weights(monkeypatch, tmp_path):
    """A regional runner stores a unit per width; a runner of another model object, other weights, loads
    them (nothing traced, nothing stored) and gives its own eager logits; a corrupt file is compiled
    again; a frozen unit is never stored."""
    monkeypatch.setenv(STORE_ENV, str(tmp_path))
    loads = []
    load = torch.compiler.load_compiled_function
    monkeypatch.setattr(torch.compiler, "load_compiled_function", lambda f: loads.append(1) or load(f))
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(1, 300, (9,), generator=g)
    steps = [torch.randint(1, 300, (w,), generator=g) for w in (1, 3, 1)]
    path = DevicePath(False, regional=True)

    first = make_tiny_llama(300, hidden_size=64, num_layers=3, seed=1)
    _feeds(StaticRunner(first, capacity=64, device_path=path), prompt, steps)
    stored = sorted(tmp_path.glob("*.unit"))
    assert len(stored) == 2 and not loads  # widths 1 and 3

    second = copy.deepcopy(first)
    with torch.no_grad():
        for p in second.parameters():
            p.mul_(1.1)
    got = _feeds(StaticRunner(second, capacity=64, device_path=path), prompt, steps)
    want = _feeds(StaticRunner(second, capacity=64, compile=False), prompt, steps)
    assert len(loads) == 2 and sorted(tmp_path.glob("*.unit")) == stored
    for g_, w_ in zip(got, want, strict=True):
        torch.testing.assert_close(g_, w_, rtol=1e-5, atol=1e-5)

    stored[0].write_bytes(b"not a unit")
    third = copy.deepcopy(second)  # (a runner holds its model weakly)
    got = _feeds(StaticRunner(third, capacity=64, device_path=path), prompt, steps)
    for g_, w_ in zip(got, want, strict=True):
        torch.testing.assert_close(g_, w_, rtol=1e-5, atol=1e-5)
    assert stored[0].stat().st_size > 100  # stored again

    frozen = make_tiny_llama(300, hidden_size=64, num_layers=3, seed=3)
    _feeds(StaticRunner(frozen, capacity=64, device_path=DevicePath(False, regional=False)), prompt, steps)
    assert sorted(tmp_path.glob("*.unit")) == stored


def test_the_store_is_switched_off_or_moved_by_its_variable_and_skips_what_it_cannot_hold(
    monkeypatch, tmp_path
):
    monkeypatch.setenv(STORE_ENV, "0")
    assert UnitStore.default() is None
    monkeypatch.setenv(STORE_ENV, str(tmp_path / "units"))
    store = UnitStore.default()
    assert store is not None and store.root == tmp_path / "units"

    def double(x):
        return x * 2

    settings = {"fullgraph": True, "dynamic": False}
    assert store.unit(double, settings, (threading.Lock(),), {}) is None  # no stable description
    symbolic = torch.zeros(4, 2)
    torch._dynamo.mark_dynamic(symbolic, 0)
    assert store.unit(double, settings, (symbolic,), {}) is None  # one graph for many sizes
    import torch._inductor.config as inductor_config

    with inductor_config.patch(freezing=True):
        assert store.unit(double, settings, (torch.zeros(4, 2),), {}) is None  # weights baked in
    unit = store.unit(double, settings, (torch.zeros(4, 2),), {})
    assert unit is not None and store.saves == 1
    torch.testing.assert_close(unit(torch.ones(4, 2)), torch.full((4, 2), 2.0))

    def branches(x):
        return x * 2 if x.sum() > 0 else x  # data-dependent control flow: no full graph to capture

    assert store.unit(branches, settings, (torch.ones(4, 2),), {}) is None and store.saves == 1
    unwritable = UnitStore(tmp_path / "a-file")
    unwritable.root.write_text("")  # the store's directory cannot be made: the unit runs all the same
    unit = unwritable.unit(double, settings, (torch.zeros(3),), {})
    assert unit is not None and unwritable.saves == 0
    torch.testing.assert_close(unit(torch.ones(3)), torch.full((3,), 2.0))
    later = UnitStore(store.root)
    again = later.unit(double, settings, (torch.zeros(4, 2),), {})
    assert later.hits == 1 and later.saves == 0
    torch.testing.assert_close(again(torch.ones(4, 2)), torch.full((4, 2), 2.0))


@pytest.mark.slow
def test_a_decoder_on_loaded_units_decodes_the_eager_tokens(tiny_llama_pair, monkeypatch, tmp_path):
    """A fast SpeculativeDecoder on regional units (the size rule lowered to mark the tiny pair) stores its
    target's units at `warm_up`; a second decoder, on copies of the models, loads every one of them, stores
    nothing, and decodes the eager decoder's greedy tokens."""
    from acchead.inference import compile_regions
    from acchead.inference.decoder import SpeculativeDecoder

    monkeypatch.setattr(compile_regions, "MIN_REGION_LAYER_PARAMS", 0)
    monkeypatch.setenv(STORE_ENV, str(tmp_path))
    loads = []
    load = torch.compiler.load_compiled_function
    monkeypatch.setattr(torch.compiler, "load_compiled_function", lambda f: loads.append(1) or load(f))
    target, draft = tiny_llama_pair
    SpeculativeDecoder(target, draft, policy="specdec:k=2", fast=True).warm_up(48)
    stored = sorted(tmp_path.glob("*.unit"))
    assert stored and not loads
    target2, draft2 = copy.deepcopy(target), copy.deepcopy(draft)
    fast = SpeculativeDecoder(target2, draft2, policy="specdec:k=2", fast=True)
    fast.warm_up(48)
    assert len(loads) == len(stored) and sorted(tmp_path.glob("*.unit")) == stored
    eager = SpeculativeDecoder(target, draft, policy="specdec:k=2", fast=False)
    for prompt in (torch.tensor([5, 9, 17, 33, 2]), torch.tensor([7, 1, 4])):
        got, ref = (d.generate(prompt, max_new_tokens=24, temperature=0.0) for d in (fast, eager))
        assert got.new_ids.tolist() == ref.new_ids.tolist()
