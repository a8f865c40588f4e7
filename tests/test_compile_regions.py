"""Regional compilation (`acchead.inference.compile_regions`): which models it marks, that the marks last
only while a unit compiles, and that a regional unit computes what the eager model does, on the CPU."""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_llama
from torch._dynamo.utils import counters

from acchead.inference import compile_regions
from acchead.inference.batched import BatchedDecoder
from acchead.inference.compile_regions import decoder_layers, marked_regions, regions_for
from acchead.inference.decoder import SpeculativeDecoder
from acchead.inference.device_path import DevicePath
from acchead.inference.static_runner import StaticRunner


def _marked(model) -> list[bool]:
    return ["forward" in vars(layer) for layer in model.model.layers]


def test_layers_are_marked_by_size_and_only_where_the_mark_cannot_bypass_anything():
    """Default: layers of 1M parameters and more (the real target's 3.5M, not the demo target's 0.32M);
    `regional=True` marks any size, False none; never a single layer, nor layers with a forward of their
    own instance (hooks)."""
    small = make_tiny_llama(64, hidden_size=32, num_layers=3, seed=0)
    assert decoder_layers(small) is None and regions_for(small) is None
    assert decoder_layers(small, min_params=0) == list(small.model.layers)
    assert regions_for(small, regional=True) is not None and regions_for(small, regional=False) is None
    wide = make_tiny_llama(64, hidden_size=336, num_layers=2, seed=0)  # 1.13M parameters per layer
    params = sum(p.numel() for p in wide.model.layers[0].parameters())
    assert params >= compile_regions.MIN_REGION_LAYER_PARAMS
    assert decoder_layers(wide) == list(wide.model.layers)
    assert decoder_layers(make_tiny_llama(64, hidden_size=32, num_layers=1, seed=0), min_params=0) is None
    hooked = make_tiny_llama(64, hidden_size=32, num_layers=2, seed=0)
    hooked.model.layers[1].forward = hooked.model.layers[1].forward  # an instance's own forward
    assert decoder_layers(hooked, min_params=0) is None


def test_regional_compilation_is_a_choice_of_the_cpu_path():
    """`DevicePath.regional`: None (by size) and False anywhere; True off the device path only."""
    assert DevicePath(False).regional is None and DevicePath(False, regional=True).regional
    assert DevicePath(True, regional=False).on
    with pytest.raises(ValueError, match="CPU-path choice"):
        DevicePath(True, regional=True)


def test_the_marks_last_only_while_the_block_runs():
    """Inside, each layer's forward is the marked one and computes what the class's does; after the block,
    whatever it raised, every layer is as before (no attribute of ours left on it)."""
    model = make_tiny_llama(64, hidden_size=32, num_layers=2, seed=0)
    ids = torch.tensor([[1, 2, 3]])
    with torch.inference_mode():
        ref = model(ids).logits
        with marked_regions(list(model.model.layers)):
            assert _marked(model) == [True, True]
            torch.testing.assert_close(model(ids).logits, ref, rtol=0, atol=0)
        assert _marked(model) == [False, False]
        with pytest.raises(KeyError), marked_regions(list(model.model.layers)):
            raise KeyError("boom")
    assert _marked(model) == [False, False]


@torch.inference_mode()
def test_a_regional_unit_gives_the_eager_logits_and_compiles_once_per_width():
    """A target compiled with its layers as regions (forced: the tiny model is below the default size):
    each width compiles one graph whose Inductor code calls the layer's subgraph, its logits equal the
    eager static cache's within float32 rounding, a second call compiles nothing, and the model is left
    unmarked between compiles."""
    from torch._inductor.utils import run_and_get_code

    target = make_tiny_llama(300, hidden_size=64, num_layers=3, seed=1)
    runner = StaticRunner(target, capacity=128, device_path=DevicePath(False, regional=True))
    eager = StaticRunner(target, capacity=128, compile=False)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(1, 300, (9,), generator=g)
    for r in (runner, eager):
        r.reset(64)
        r.feed(prompt)
    for width in (1, 3):
        tokens = torch.randint(1, 300, (width,), generator=g)
        (logits, _), code = run_and_get_code(runner.feed, tokens, keep=width)
        assert any("subgraph" in c for c in code), "the unit's code calls no subgraph"
        torch.testing.assert_close(logits, eager.feed(tokens, keep=width)[0], rtol=1e-5, atol=1e-5)
        assert _marked(target) == [False] * 3
        graphs = counters["stats"]["unique_graphs"]
        for r in (runner, eager):
            r.rollback(r.length - width)
        again, _ = runner.feed(tokens, keep=width)
        eager.feed(tokens, keep=width)
        assert counters["stats"]["unique_graphs"] == graphs
        torch.testing.assert_close(again, logits, rtol=0, atol=0)


@pytest.mark.slow
def test_decoders_on_regional_units_decode_the_eager_tokens(tiny_llama_pair, monkeypatch):
    """Both fast paths with every model's layers compiled as regions (the default size rule lowered to
    mark the tiny pair): the single-prompt decoder's and the batch's greedy tokens equal the eager ones,
    and nothing compiles after `warm_up`."""
    monkeypatch.setattr(compile_regions, "MIN_REGION_LAYER_PARAMS", 0)
    target, draft = tiny_llama_pair
    prompts = [torch.tensor([5, 9, 17, 33, 2]), torch.tensor([7, 1, 4])]
    fast = SpeculativeDecoder(target, draft, policy="specdec:k=2", fast=True)
    eager = SpeculativeDecoder(target, draft, policy="specdec:k=2", fast=False)
    fast.warm_up(48)
    with torch.compiler.set_stance("fail_on_recompile"):
        for prompt in prompts:
            got, ref = (d.generate(prompt, max_new_tokens=24, temperature=0.0) for d in (fast, eager))
            assert got.new_ids.tolist() == ref.new_ids.tolist()
    batched = BatchedDecoder(target, draft, "specdec:k=1", fast=True)
    batched.warm_up(len(prompts), 40)
    ref = BatchedDecoder(target, draft, "specdec:k=1").generate(prompts, 16, temperature=0)
    graphs = counters["stats"]["unique_graphs"]
    res = batched.generate(prompts, 16, temperature=0)
    assert counters["stats"]["unique_graphs"] == graphs
    assert [r.new_ids.tolist() for r in res.rows] == [r.new_ids.tolist() for r in ref.rows]
