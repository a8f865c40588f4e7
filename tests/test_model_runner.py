"""acchead.inference.model_runner: a model's fast runner lives in the module's registry, not on the model; the
static cache is driven through transformers' public API; compiling leaves dynamo's settings alone."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from conftest import make_tiny_llama

import acchead.inference.model_runner as model_runner
from acchead.errors import AccheadError
from acchead.inference.model_runner import EagerRunner, make_runner
from acchead.inference.static_runner import StaticRunner


def test_a_models_fast_runner_is_shared_kept_off_the_model_and_freed_with_it():
    target = make_tiny_llama(64, hidden_size=32, num_layers=2, seed=1)
    runner = make_runner(target, fast=True)
    assert isinstance(runner, StaticRunner) and make_runner(target, fast=True) is runner
    assert not any(isinstance(v, StaticRunner) for v in vars(target).values())
    assert isinstance(make_runner(target, fast=False), EagerRunner)
    assert make_runner(target, fast=True, compile=False) is not runner  # tests' private runners
    assert model_runner._FAST_RUNNERS[target] is runner
    gone = weakref.ref(target)
    del target, runner
    gc.collect()
    assert gone() is None  # the registry's key is weak, and the runner refers to its model weakly


def test_a_cache_that_cannot_roll_back_is_refused(monkeypatch):
    from transformers import StaticCache

    def no_crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError

    monkeypatch.setattr(StaticCache, "crop", no_crop)
    with pytest.raises(AccheadError, match="write positions that roll"):
        StaticRunner(make_tiny_llama(64, hidden_size=32, num_layers=2, seed=1), compile=False)


def test_a_grown_cache_keeps_the_prefix():
    """Feeding past the capacity moves the cached prefix into a larger cache (public `update`): the logits
    after it equal the eager runner's."""
    target = make_tiny_llama(64, hidden_size=32, num_layers=2, seed=1)
    static, eager = StaticRunner(target, capacity=1, compile=False), EagerRunner(target)
    assert static.capacity == 128
    prompt = torch.arange(1, 121) % 60
    with torch.inference_mode():  # as the decoders feed (the static cache's tensors are inference tensors)
        for runner in (static, eager):
            runner.reset(0)
            runner.feed(prompt)
        got, _ = static.feed(torch.arange(10, 30))  # 140 tokens: grows to 256
        want, _ = eager.feed(torch.arange(10, 30))
    assert static.capacity == 256 and static.length == eager.length == 140
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_compiling_leaves_dynamos_settings_alone(compiled_pair):
    """The recompile limits are raised only while a unit compiles (`torch._dynamo.config.patch`)."""
    import torch._dynamo

    config = torch._dynamo.config
    before = (config.recompile_limit, config.accumulated_recompile_limit)
    target, _ = compiled_pair
    runner = make_runner(target, fast=True)
    with torch.inference_mode():
        runner.reset(16)
        runner.feed(torch.tensor([1, 2, 3]))
        got, _ = runner.feed(torch.tensor([4]))  # a one-token unit: compiled
        assert (config.recompile_limit, config.accumulated_recompile_limit) == before
        eager = EagerRunner(target)
        eager.feed(torch.tensor([1, 2, 3]))
        want, _ = eager.feed(torch.tensor([4]))
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
