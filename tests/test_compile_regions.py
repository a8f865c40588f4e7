"""Regional compilation (`acchead.inference.compile_regions`): which models it marks, that the marks last
only while a unit compiles, and that a regional unit computes what the eager model does, on the CPU."""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_llama
from torch._dynamo.utils import counters
from transformers import DynamicCache
from transformers.cache_utils import StaticLayer

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
    `regional=True` marks any size, False none; never a single layer, however wide (compiled whole), nor
    layers with a forward of their own instance (hooks)."""
    small = make_tiny_llama(64, hidden_size=32, num_layers=3, seed=0)
    assert decoder_layers(small) is None and regions_for(small) is None
    assert decoder_layers(small, min_params=0) == list(small.model.layers)
    assert regions_for(small, regional=True) is not None and regions_for(small, regional=False) is None
    wide = make_tiny_llama(64, hidden_size=336, num_layers=2, seed=0)  # 1.13M parameters per layer
    params = sum(p.numel() for p in wide.model.layers[0].parameters())
    assert params >= compile_regions.MIN_REGION_LAYER_PARAMS
    assert decoder_layers(wide) == list(wide.model.layers)
    one = make_tiny_llama(64, hidden_size=32, num_layers=1, seed=0)
    assert decoder_layers(one, min_params=0) is None  # one layer: nothing to mark, nothing to reuse
    assert regions_for(one) is None and regions_for(one, regional=True) is None  # compiled whole
    one_wide = make_tiny_llama(64, hidden_size=336, num_layers=1, seed=0)
    assert regions_for(one_wide) is None
    hooked = make_tiny_llama(64, hidden_size=32, num_layers=2, seed=0)
    hooked.model.layers[1].forward = hooked.model.layers[1].forward  # an instance's own forward
    assert decoder_layers(hooked, min_params=0) is None
    shared = make_tiny_llama(64, hidden_size=32, num_layers=2, seed=0)
    shared.model.layers[1].self_attn.layer_idx = 0  # reads another layer's cache
    assert decoder_layers(shared, min_params=0) is None


def test_a_layer_slot_updates_the_cache_tensors_as_their_static_layer_does():
    """`_LayerSlot` over a `StaticLayer`'s own tensors, called as the attention calls its cache (with a layer
    index), writes what the layer's `update` writes, in place, and moves the same write position."""
    g = torch.Generator().manual_seed(0)
    first, more = (torch.randn(1, 2, n, 4, generator=g) for n in (3, 2))
    layers = [StaticLayer(max_cache_len=8), StaticLayer(max_cache_len=8)]
    for layer in layers:
        layer.update(first, first + 1)
    keys, values = layers[0].update(more, more + 1)
    slot = compile_regions._LayerSlot(layers[1].keys, layers[1].values, layers[1].cumulative_length)
    got_keys, got_values = slot.update(more, more + 1, 7)
    assert got_keys is layers[1].keys and got_values is layers[1].values
    torch.testing.assert_close(got_keys, keys, rtol=0, atol=0)
    torch.testing.assert_close(got_values, values, rtol=0, atol=0)
    assert int(layers[1].cumulative_length) == int(layers[0].cumulative_length) == 5
    # only a full-attention static layer has a slot
    assert compile_regions._slot_of(DynamicCache(), 0) is None and compile_regions._slot_of(None, 0) is None


def test_only_attention_nobody_kernelized_runs_without_the_kernels_wrapper():
    """Where transformers' attention sits under the `kernels` package's `use_kernelized_func` wrapper (a side
    effect per call that keeps dynamo from reusing a traced layer), a marked layer's attention runs the
    forward under it while the block runs; not once a kernel function of it is replaced (kernelized)."""
    model = make_tiny_llama(64, hidden_size=32, num_layers=2, seed=0)
    attn = model.model.layers[0].self_attn
    inner = compile_regions._unwrapped_forward(attn)
    if inner is None:
        pytest.skip("transformers' Llama attention has no kernels wrapper here")
    assert inner is type(attn).forward.__wrapped__
    with marked_regions(list(model.model.layers)):
        assert attn.forward.__func__ is inner
    assert "forward" not in vars(attn)
    kernel_func = next(iter(vars(attn)["_kernel_funcs"].values()))
    kernel_func.forward = kernel_func.forward  # what `kernels.kernelize` does: an instance's own forward
    assert compile_regions._unwrapped_forward(attn) is None


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


@pytest.mark.parametrize("slots", [True, False], ids=["cache-slots", "no-slots"])
@torch.inference_mode()
def test_a_regional_unit_gives_the_eager_logits_and_compiles_once_per_width(monkeypatch, slots, tmp_path):
    """A target compiled with its layers as regions (forced: the tiny model is below the default size):
    each width compiles one graph whose Inductor code calls the layer's subgraph, which dynamo traced once
    and reused for the other two layers (without cache slots, as for a cache that is no full-attention
    `StaticLayer`, it may trace each), its logits equal the eager static cache's within float32 rounding,
    a second call compiles nothing, and the model is left unmarked between compiles. (An empty store of
    compiled units: each unit is traced, not loaded.)"""
    from torch._dynamo.variables import invoke_subgraph
    from torch._inductor.utils import run_and_get_code

    monkeypatch.setenv("ACCHEAD_UNIT_STORE", str(tmp_path))
    stamped = []  # a layer dynamo did not trace: it stamped out a traced one's subgraph
    stamp_out = invoke_subgraph.stamp_out_subgraph
    monkeypatch.setattr(invoke_subgraph, "stamp_out_subgraph", lambda *a: stamped.append(1) or stamp_out(*a))
    if not slots:
        monkeypatch.setattr(compile_regions, "_slot_of", lambda cache, index: None)

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
        stamped.clear()
        (logits, _), code = run_and_get_code(runner.feed, tokens, keep=width)
        assert any("subgraph" in c for c in code), "the unit's code calls no subgraph"
        assert len(stamped) == 2 or not slots, "dynamo traced every layer anew"
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
