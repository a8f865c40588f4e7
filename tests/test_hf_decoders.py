"""The `generate` integration's decoders and default heads are owned by `acchead.inference.hf_decoders`,
not stored on the models: reused per arguments, bounded, released explicitly, and freed with the models."""

from __future__ import annotations

import gc
import weakref

import pytest
from conftest import make_tiny_llama

from acchead.inference import hf_decoders
from acchead.inference.hf_decoders import DecoderCache
from acchead.sampling import SamplingConfig


def _pair(vocab: int = 64):
    return make_tiny_llama(vocab, 32, 1, seed=1), make_tiny_llama(vocab, 16, 1, seed=2)


def test_one_decoder_per_arguments_least_recently_used_dropped_first():
    target, draft = _pair()
    cache = DecoderCache(size=2)
    k2 = cache.get(target, draft, "specdec:k=2", None, "token", None)
    assert cache.get(target, draft, "specdec:k=2", None, "token", None) is k2
    k3 = cache.get(target, draft, "specdec:k=3", None, "token", None)
    assert cache.get(target, draft, "specdec:k=2", None, "token", None) is k2  # k2 now the most recent
    cache.get(target, draft, "specdec:k=4", None, "token", None)  # evicts k3, the least recently used
    assert len(cache) == 2 and k3 not in cache.decoders(target) and k2 in cache.decoders(target)
    assert cache.get(target, draft, "specdec:k=2", None, "block", None) is not k2  # the verifier is a key
    with pytest.raises(ValueError, match="at least one"):
        DecoderCache(size=0)


def test_release_lets_the_models_go():
    """Nothing is stored on the models; once released (or cleared), the cache holds no reference."""
    target, draft = _pair()
    cache = DecoderCache()
    other_target, _ = _pair()
    cache.get(target, draft, "specdec:k=2", None, "token", None)
    kept = cache.get(other_target, draft, "specdec:k=2", None, "token", None)
    assert not [k for k in vars(target) if "acchead" in k]
    cache.release(target)
    assert cache.decoders(target) == [] and cache.decoders(other_target) == [kept]
    gone = weakref.ref(target)
    del target
    gc.collect()
    assert gone() is None
    cache.release(draft)  # as draft too
    assert len(cache) == 0
    cache.get(other_target, None, "autoregressive", None, "token", None)
    cache.clear()
    assert len(cache) == 0


def test_pair_head_looked_up_once_per_draft_and_s_and_freed_with_the_draft(monkeypatch):
    calls = []

    def shipped(draft, sampling):
        calls.append(sampling)
        return None

    monkeypatch.setattr(hf_decoders, "shipped_head_for", shipped)
    _, draft = _pair()
    greedy, sampled = SamplingConfig(0.0), SamplingConfig(1.0, 50)
    for s in (greedy, greedy, sampled):
        assert hf_decoders.pair_head_default(draft, s) is None
    assert calls == [greedy, sampled] and hf_decoders.pair_heads(draft) == {greedy: None, sampled: None}
    entries = len(hf_decoders._PAIR_HEADS)
    gone = weakref.ref(draft)
    del draft
    gc.collect()
    assert gone() is None and len(hf_decoders._PAIR_HEADS) < entries  # the draft's entry went with it
