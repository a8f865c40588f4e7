"""SamplingConfig and process_logits: identical to transformers' warpers and to what `generate` samples."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from acchead.sampling import SamplingConfig, probs_from_logits, process_logits, sample

GRID = [
    SamplingConfig(t, k, p)
    for t, k, p in itertools.product([0.3, 1.0, 1.7], [0, 1, 5, 40], [1.0, 0.95, 0.6, 0.05])
]


def _transformers_warp(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """The warper chain `generate` builds for cfg (temperature, top-k, top-p, in that order)."""
    warpers = LogitsProcessorList()
    if cfg.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(cfg.temperature))
    if cfg.top_k > 0:
        warpers.append(TopKLogitsWarper(cfg.top_k))
    if cfg.top_p < 1.0:
        warpers.append(TopPLogitsWarper(cfg.top_p))
    return warpers(torch.zeros(logits.shape[0], 1, dtype=torch.long), logits.clone())


@pytest.mark.parametrize("cfg", GRID, ids=str)
def test_process_logits_equals_transformers_warpers(cfg):
    gen = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(8, 64, generator=gen)
    logits[0, :4] = logits[0, 4]  # ties at the top-k boundary
    ours, theirs = process_logits(logits, cfg), _transformers_warp(logits, cfg)
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    torch.testing.assert_close(ours[torch.isfinite(ours)], theirs[torch.isfinite(theirs)])
    probs = probs_from_logits(logits, cfg)
    assert probs.dtype == torch.float32
    torch.testing.assert_close(probs.sum(-1), torch.ones(8))


@pytest.mark.parametrize("cfg", [SamplingConfig(0.7, 0, 0.9), SamplingConfig(1.3, 8, 1.0), SamplingConfig()],
                         ids=str)
def test_process_logits_equals_generate_scores(tiny_llama_pair, cfg):
    """`generate` reports raw logits and the processed scores it sampled from: ours must be the latter."""
    target, _ = tiny_llama_pair
    out = target.generate(
        torch.tensor([[1, 2, 3]]), do_sample=True, temperature=cfg.temperature, top_k=cfg.top_k,
        top_p=cfg.top_p, max_new_tokens=4, output_logits=True, output_scores=True,
        return_dict_in_generate=True,
    )  # no min_new_tokens: its processor would mask EOS in the scores, which S does not do
    assert len(out.scores) >= 1
    for raw, scores in zip(out.logits, out.scores, strict=True):
        ours = process_logits(raw, cfg)
        assert torch.equal(torch.isinf(ours), torch.isinf(scores))
        torch.testing.assert_close(ours[torch.isfinite(ours)], scores[torch.isfinite(scores)])


def test_greedy_is_one_hot_at_first_argmax():
    cfg = SamplingConfig(temperature=0.0)
    assert cfg.greedy and str(cfg) == "greedy"
    logits = torch.tensor([[0.1, 2.0, 2.0, -1.0], [5.0, 0.0, 0.0, 0.0]])
    warped = process_logits(logits, cfg)
    assert warped[0, 1] == 0 and torch.isinf(warped[0, [0, 2, 3]]).all()
    torch.testing.assert_close(probs_from_logits(logits, cfg), torch.tensor([[0.0, 1, 0, 0], [1.0, 0, 0, 0]]))


@pytest.mark.parametrize(
    "kwargs",
    [{"temperature": -0.5}, {"temperature": math.nan}, {"temperature": math.inf}, {"top_k": -1},
     {"top_p": 0.0}, {"top_p": 1.5}],
)
def test_invalid_configs_raise(kwargs):
    with pytest.raises(ValueError):
        SamplingConfig(**kwargs)


def test_dict_round_trip_and_frozen():
    cfg = SamplingConfig(0.6, 20, 0.9)
    assert SamplingConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.to_dict() == {"temperature": 0.6, "top_k": 20, "top_p": 0.9}
    with pytest.raises(AttributeError):
        cfg.top_k = 3  # type: ignore[misc]


def test_sample_is_seeded_and_stays_in_support():
    probs = probs_from_logits(torch.randn(2, 3, 50), SamplingConfig(1.0, 5, 1.0))
    a = sample(probs, torch.Generator().manual_seed(7))
    b = sample(probs, torch.Generator().manual_seed(7))
    assert a.shape == (2, 3) and a.dtype == torch.int64 and torch.equal(a, b)
    assert (probs.gather(-1, a.unsqueeze(-1)) > 0).all()
