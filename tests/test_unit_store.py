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

from acchead.errors import AccheadError
from acchead.inference.device_path import DevicePath
from acchead.inference.static_runner import StaticRunner
from acchead.inference.unit_store import LIMIT_ENV, STORE_ENV, UnitStore, Unstable, digest, stable_form

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
    b.config._name_or_path = b.name_or_path = "/elsewhere/a-copy"  # loaded from another directory
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
    again; a runner of whole-model units (the C++ wrapper) stores and loads its own."""
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

    whole = DevicePath(False, regional=False)  # units of the whole model, with the C++ wrapper: stored too
    before = len(loads)
    other = make_tiny_llama(300, hidden_size=64, num_layers=3, seed=3)  # (held: a runner holds it weakly)
    _feeds(StaticRunner(other, capacity=64, device_path=whole), prompt, steps)
    assert len(list(tmp_path.glob("*.unit"))) == 4 and len(loads) == before
    fourth = copy.deepcopy(second)
    got = _feeds(StaticRunner(fourth, capacity=64, device_path=whole), prompt, steps)
    assert len(loads) == before + 2 and len(list(tmp_path.glob("*.unit"))) == 4  # on the copy's weights
    for g_, w_ in zip(got, want, strict=True):
        torch.testing.assert_close(g_, w_, rtol=1e-5, atol=1e-5)


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


def _judged(judge, q, token, logits, state, stats):
    """A draft step's stop rule as a unit of its own (`units.draft_post` calls it so after the forward)."""
    from acchead.inference.units import DraftStep

    return judge(DraftStep(token=token, q=q, hidden=None, index=0, logits=logits, state=state), stats)


def test_policies_that_differ_only_in_untraced_attributes_share_a_stored_judge(tmp_path):
    """Stop policies whose thresholds differ (a SpecDec++ h, priced or not, with another head's weights; a
    confidence threshold; AdaEDL's starting λ) share a digest, and the judge one stored, loaded and called
    with the other's arguments, gives the other's own flags and stats; what a judge reads as a constant
    (AdaEDL's γ) keeps digests apart."""
    from test_lookahead import lookahead_head

    from acchead.inference.adaedl import AdaEDL
    from acchead.inference.policies import Confidence
    from acchead.inference.specdecpp_policy import SpecDecPP

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(10, 50, generator=g) * 2
    states = torch.randn(10, 16, generator=g)
    tokens = torch.randint(0, 50, (10,), generator=g)
    log_p = torch.linspace(-3.0, 0.0, 10, dtype=torch.float64)

    def calls(policy):
        if isinstance(policy, AdaEDL):  # stats: the round's λ, which starts at the policy's
            lams = [policy.lam0 + d for d in (-0.2, -0.1, 0.0, 0.1, 0.2) * 2]
            stats = [torch.tensor(lam, dtype=torch.float64) for lam in lams]
        elif isinstance(policy, SpecDecPP):  # stats: [log P̂, judged count]
            counts = torch.arange(10, dtype=torch.float64) % 4
            stats = [torch.stack([log_p[i], counts[i]]) for i in range(10)]
        else:
            stats = [None] * 10
        return [(policy.judge, torch.softmax(logits[i], -1), tokens[i], logits[i], states[i], stats[i])
                for i in range(10)]  # fmt: skip

    head_b = lookahead_head(16)
    with torch.no_grad():
        head_b.out.weight.mul_(-1.5)
    priced = SpecDecPP(head_b, 0.9, max_draft=4, priced=True)
    priced.price_widths({1: 10.0, 2: 10.0, 3: 14.0, 4: 14.0, 5: 19.0, 6: 19.0})
    pairs = [
        (SpecDecPP(lookahead_head(16), 0.7, max_draft=4), priced),
        (Confidence(0.02), Confidence(0.2)),
        (AdaEDL(0.3), AdaEDL(0.6, adapt=False)),
    ]
    assert digest(AdaEDL(0.3).judge) != digest(AdaEDL(0.3, gamma=0.4).judge)
    assert digest(SpecDecPP(lookahead_head(16), 0.7, max_draft=6).judge) != digest(pairs[0][0].judge)
    settings = {"fullgraph": True, "dynamic": False}
    for a, b in pairs:
        assert digest(a.judge) == digest(b.judge), (a, b)
        first, later = UnitStore(tmp_path), UnitStore(tmp_path)
        unit = first.unit(_judged, settings, calls(a)[0], {})
        assert unit is not None and first.saves == 1, a
        loaded = later.unit(_judged, settings, calls(b)[0], {})
        assert loaded is not None and later.hits == 1 and later.saves == 0
        flags_a = [_judged(*args)[0].item() for args in calls(a)]
        for args in calls(b):
            got, want = loaded(*args), _judged(*args)
            assert got[0].item() == want[0].item(), (b, args[-1])
            if want[1] is not None:
                torch.testing.assert_close(got[1], want[1])
        flags_b = [_judged(*args)[0].item() for args in calls(b)]
        assert flags_b != flags_a, (a, b)  # else the loaded judge could be a's baked in and pass


def test_past_its_limit_the_store_removes_the_units_used_least_recently(monkeypatch, tmp_path):
    """Three units of ~equal size under a limit of two and a half: saving the third removes the one
    neither saved nor loaded most recently (a load marks a unit used); the limit comes from
    `ACCHEAD_UNIT_STORE_GB`, refused in one line when it is not a number."""
    settings = {"fullgraph": True, "dynamic": False}

    def double(x):
        return x * 2

    store = UnitStore(tmp_path)
    store.unit(double, settings, (torch.zeros(3),), {})
    size = next(tmp_path.glob("*.unit")).stat().st_size
    store.limit_bytes = int(size * 2.5)
    store.unit(double, settings, (torch.zeros(4),), {})
    first, second = sorted(tmp_path.glob("*.unit"), key=lambda f: f.stat().st_mtime_ns)
    os.utime(first, (1, 1))  # both used long ago, the first before the second...
    os.utime(second, (2, 2))
    assert store.unit(double, settings, (torch.zeros(3),), {}) is not None  # ...and the first again now
    assert store.hits == 1
    store.unit(double, settings, (torch.zeros(5),), {})
    assert store.saves == 3 and store.evicted == 1
    assert first.exists() and not second.exists() and len(list(tmp_path.glob("*.unit"))) == 2

    monkeypatch.setenv(LIMIT_ENV, "0.5")
    assert UnitStore(tmp_path).limit_bytes == 2**29
    monkeypatch.setenv(LIMIT_ENV, "lots")
    with pytest.raises(AccheadError, match="gigabytes"):
        UnitStore(tmp_path)
