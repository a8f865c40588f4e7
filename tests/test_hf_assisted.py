"""Hugging Face assisted generation: exact under greedy, and its forward counts follow the cost model."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from acchead.inference.bench.hf_assisted import (
    ForwardCounter,
    hf_assisted_generate,
    sampling_kwargs,
    schedule_params,
)
from acchead.sampling import SamplingConfig


def _tiny_lm(seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def pair() -> tuple[LlamaForCausalLM, LlamaForCausalLM]:
    return _tiny_lm(0), _tiny_lm(1)


PROMPT = torch.tensor([[3, 1, 4, 1, 5, 9]])


def test_forward_counter_counts_and_detaches(pair):
    target, _ = pair
    with ForwardCounter(target) as c:
        target(PROMPT)
        target(PROMPT)
    assert c.calls == 2
    target(PROMPT)  # hook removed on exit
    assert c.calls == 2


def test_greedy_assisted_equals_target_greedy_and_counts_are_consistent(pair):
    target, draft = pair
    res = hf_assisted_generate(target, draft, PROMPT, max_new_tokens=24, sampling=SamplingConfig(0.0))
    ref = target.generate(PROMPT, max_new_tokens=24, do_sample=False, pad_token_id=0, eos_token_id=None)
    assert torch.equal(res.new_ids, ref[0, PROMPT.shape[1] :])
    assert res.tokens == 24
    # Each round is one target forward and yields >= 1 token; the draft proposes >= 0 per round.
    assert 1 <= res.target_calls <= res.tokens
    assert res.draft_calls + res.target_calls == res.tokens + res.discarded  # eq. 2.2
    assert 0 <= res.discarded <= res.draft_calls
    assert res.wall_time > 0


def test_identical_draft_discards_nothing(pair):
    # A draft equal to the target is always accepted under greedy: every round yields its candidates plus
    # the bonus token, so N = N_draft + N_target exactly and nothing is discarded.
    target, _ = pair
    twin = copy.deepcopy(target)
    res = hf_assisted_generate(target, twin, PROMPT, max_new_tokens=20, sampling=SamplingConfig(0.0))
    assert res.tokens == 20
    assert res.discarded == 0
    assert res.draft_calls > 0
    assert res.target_calls < res.tokens


def test_sampling_is_seeded_and_counts_hold(pair):
    target, draft = pair
    s = SamplingConfig(temperature=1.0, top_k=20, top_p=0.95)
    a = hf_assisted_generate(target, draft, PROMPT, max_new_tokens=16, sampling=s, seed=7)
    b = hf_assisted_generate(target, draft, PROMPT, max_new_tokens=16, sampling=s, seed=7)
    assert torch.equal(a.new_ids, b.new_ids)
    assert (a.target_calls, a.draft_calls) == (b.target_calls, b.draft_calls)
    assert a.draft_calls + a.target_calls == a.tokens + a.discarded


def test_eos_ends_generation(pair):
    target, draft = pair
    full = hf_assisted_generate(target, draft, PROMPT, max_new_tokens=12, sampling=SamplingConfig(0.0))
    eos = int(full.new_ids[3])
    first = int((full.new_ids == eos).nonzero()[0])
    res = hf_assisted_generate(
        target, draft, PROMPT, max_new_tokens=12, sampling=SamplingConfig(0.0), eos_token_id=eos
    )
    assert res.tokens == first + 1
    assert int(res.new_ids[-1]) == eos


def test_same_module_twice_is_refused(pair):
    target, _ = pair
    with pytest.raises(ValueError, match="distinct"):
        hf_assisted_generate(target, target, PROMPT, max_new_tokens=4, sampling=SamplingConfig(0.0))


def test_settings_reported():
    assert sampling_kwargs(SamplingConfig(0.0)) == {"do_sample": False}
    kw = sampling_kwargs(SamplingConfig(0.7, 0, 0.9))
    assert kw == {"do_sample": True, "temperature": 0.7, "top_k": None, "top_p": 0.9}
    params = schedule_params(_tiny_lm(2))
    assert params["num_assistant_tokens"] == 20 and params["confidence_threshold"] == 0.4
