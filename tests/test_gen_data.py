"""The labelling math of acchead.data_gen.labeler, checked against independent unbatched computations.

accept_prob is recomputed with transformers' own logits warpers on full-sequence logits of unbatched
forwards; greedy responses are compared with `generate`; rows must not depend on batch composition.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import record_forward_shapes
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from acchead.data_gen.labeler import Labeler, sample_inverse_cdf, stream_uniforms
from acchead.models import final_hidden
from acchead.sampling import SamplingConfig

PROMPTS = [
    "def add(a, b):\n    return",
    "for i in range(10):\n    if i % 2 == 0:\n        print(",
    "x",
    "class Point:\n    def __init__(self, x, y):\n",
]


def make_labeler(pair, tokenizer, sampling, **kw) -> Labeler:
    target, draft = pair
    opts = dict(
        mix_ratio=0.15,
        seed=0,
        max_new_tokens=10,
        eos_ids=[tokenizer.eos_token_id],
        pad_id=tokenizer.eos_token_id,
        cache_features=True,
    )
    return Labeler(target, draft, sampling, **{**opts, **kw})


def encode(tokenizer) -> list[list[int]]:
    return [tokenizer(p).input_ids for p in PROMPTS]


def hf_probs(model, prompt: list[int], response: list[int], s: SamplingConfig) -> torch.Tensor:
    """(N, V) distributions of the response tokens: one unbatched forward, transformers' warpers."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()  # (N, V): row i predicts response[i]
    if s.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.size(-1)).float()
    warpers = LogitsProcessorList([TemperatureLogitsWarper(s.temperature)])
    if s.top_k:
        warpers.append(TopKLogitsWarper(s.top_k))
    if s.top_p < 1:
        warpers.append(TopPLogitsWarper(s.top_p))
    return warpers(ids, logits).softmax(-1)


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingConfig(1.0, 0, 1.0),
        SamplingConfig(0.7, 20, 0.9),
        SamplingConfig(1.5, 0, 0.8),
        SamplingConfig(0.0),
    ],
    ids=str,
)
def test_accept_prob_matches_transformers_warpers(tiny_llama_pair, tiny_tokenizer, sampling):
    prompts = encode(tiny_tokenizer)
    rows = make_labeler(tiny_llama_pair, tiny_tokenizer, sampling).label([0, 1, 2, 3], prompts)
    target, draft = tiny_llama_pair
    labels = []
    for row, prompt in zip(rows, prompts, strict=True):
        assert row.prompt_ids.tolist() == prompt
        x, y = row.response_ids.tolist(), torch.from_numpy(row.draft_ids).long()
        p, q = hf_probs(target, prompt, x, sampling), hf_probs(draft, prompt, x, sampling)
        qy = q.gather(-1, y[:, None]).squeeze(-1)
        assert (qy > 0).all(), "Y must be drawn from q"
        expected = torch.clamp(p.gather(-1, y[:, None]).squeeze(-1) / qy, max=1.0)
        torch.testing.assert_close(torch.from_numpy(row.accept_prob), expected, atol=1e-5, rtol=1e-5)
        labels.append(expected)
    labels = torch.cat(labels)
    if sampling == SamplingConfig(1.0, 0, 1.0):  # untruncated: labels strictly inside (0, 1) must occur
        assert ((labels > 0) & (labels < 1)).any()


def test_greedy_responses_match_generate_and_stop_at_eos(tiny_llama_pair, tiny_tokenizer):
    target, _ = tiny_llama_pair
    prompts = encode(tiny_tokenizer)
    greedy = SamplingConfig(0.0)
    free = make_labeler(tiny_llama_pair, tiny_tokenizer, greedy, eos_ids=[-1]).label([0, 1, 2, 3], prompts)
    assert all(len(r.response_ids) == 10 for r in free)
    # Make a token that row 0 emits at step 4 the EOS: row 0 must stop right after it (EOS kept).
    eos = int(free[0].response_ids[3])
    rows = make_labeler(tiny_llama_pair, tiny_tokenizer, greedy, eos_ids=[eos]).label([0, 1, 2, 3], prompts)
    first = free[0].response_ids.tolist().index(eos)
    assert rows[0].response_ids.tolist() == free[0].response_ids[: first + 1].tolist()
    for row, prompt in zip(rows, prompts, strict=True):
        ids = torch.tensor([prompt])
        out = target.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=10,
            eos_token_id=eos,
            pad_token_id=eos,
        )[0, len(prompt) :].tolist()
        if eos in out:
            out = out[: out.index(eos) + 1]
        assert row.response_ids.tolist() == out


def test_rows_do_not_depend_on_batching_or_mix_ratio(tiny_llama_pair, tiny_tokenizer):
    s = SamplingConfig(0.9, 0, 0.95)
    prompts = encode(tiny_tokenizer)
    lab = make_labeler(tiny_llama_pair, tiny_tokenizer, s)
    batched = lab.label([5, 6, 7, 8], prompts)
    single = [lab.label([i], [p])[0] for i, p in zip([5, 6, 7, 8], prompts, strict=True)]
    mixed_more = make_labeler(tiny_llama_pair, tiny_tokenizer, s, mix_ratio=0.6).label([5, 6, 7, 8], prompts)
    for a, b, c in zip(batched, single, mixed_more, strict=True):
        for name in ("response_ids", "draft_ids", "mixed_ids", "from_draft"):
            assert (getattr(a, name) == getattr(b, name)).all(), name
        torch.testing.assert_close(torch.from_numpy(a.accept_prob), torch.from_numpy(b.accept_prob))
        torch.testing.assert_close(
            torch.from_numpy(a.features), torch.from_numpy(b.features), atol=1e-3, rtol=0
        )
        # Separate random streams: another r changes Z only.
        assert (a.response_ids == c.response_ids).all() and (a.draft_ids == c.draft_ids).all()
    # ... and another prompt index (the seed of its streams) changes the sample.
    other = lab.label([9], [prompts[0]])[0]
    assert (other.draft_ids != batched[0].draft_ids).any()


@pytest.mark.parametrize("mix_ratio", [0.0, 0.5, 1.0])
def test_mixing_and_cached_features(tiny_llama_pair, tiny_tokenizer, mix_ratio):
    _, draft = tiny_llama_pair
    prompts = encode(tiny_tokenizer)
    rows = make_labeler(
        tiny_llama_pair, tiny_tokenizer, SamplingConfig(1.0), mix_ratio=mix_ratio, max_new_tokens=16
    ).label([0, 1, 2, 3], prompts)
    fd = torch.cat([torch.from_numpy(r.from_draft) for r in rows])
    if mix_ratio == 0.0:
        assert fd.all()
    elif mix_ratio == 1.0:
        assert not fd.any()
    else:
        assert 0.3 < fd.float().mean() < 0.7  # 64 Bernoulli(0.5) draws
    for row, prompt in zip(rows, prompts, strict=True):
        x, y, z, sel = row.response_ids, row.draft_ids, row.mixed_ids, row.from_draft
        assert (z[sel] == y[sel]).all() and (z[~sel] == x[~sel]).all()
        # The head's input at position i: the draft's final hidden state where Z_i is fed, over prompt+Z.
        ids = torch.tensor([prompt + z.tolist()])
        with torch.no_grad():
            h = final_hidden(draft(ids, output_hidden_states=True))[0, len(prompt) :]
        assert row.features.dtype == np.float16
        assert row.features.shape == (int(sel.sum()), draft.config.hidden_size)
        torch.testing.assert_close(
            torch.from_numpy(row.features).float(), h[torch.from_numpy(sel)], atol=2e-3, rtol=1e-3
        )


def test_inverse_cdf_sampling_is_exact_on_a_uniform_grid():
    probs = torch.tensor([[0.0, 0.25, 0.0, 0.5, 0.25, 0.0], [0.0, 0.0, 1.0, 0.0, 0.0, 0.0]])
    m = 4000  # u = (k + 1/2) / m hits each token exactly probs * m times
    u = (torch.arange(m, dtype=torch.float64) + 0.5) / m
    draws = sample_inverse_cdf(probs[:, None, :].expand(2, m, 6), u.expand(2, m))
    counts = torch.stack([torch.bincount(d, minlength=6) for d in draws]).double() / m
    torch.testing.assert_close(counts, probs.double())
    # The extremes of [0, 1) never pick a zero-probability token, even with unnormalised mass.
    edge = torch.tensor([0.0, np.nextafter(1.0, 0.0)], dtype=torch.float64)
    unnormalised = torch.tensor([0.0, 0.3, 0.3, 0.0]).expand(2, 4)
    assert sample_inverse_cdf(unnormalised, edge).tolist() == [1, 2]


def test_streams_are_independent_and_reproducible():
    a = stream_uniforms(0, 7, "draft", 5)
    assert np.array_equal(a, stream_uniforms(0, 7, "draft", 8)[:5])  # a prefix: longer responses extend it
    for other in (
        stream_uniforms(1, 7, "draft", 5),
        stream_uniforms(0, 8, "draft", 5),
        stream_uniforms(0, 7, "mix", 5),
    ):
        assert not np.array_equal(a, other)
    with pytest.raises(ValueError, match="unknown stream"):
        stream_uniforms(0, 7, "typo", 5)


def test_models_with_padded_vocabularies(tiny_llama_pair, tiny_tokenizer):
    """Real pairs often pad embedding matrices differently; a token outside the target's has p = 0."""
    from conftest import make_tiny_llama

    target, _ = tiny_llama_pair
    vocab = len(tiny_tokenizer)
    draft = make_tiny_llama(vocab + 64, hidden_size=32, num_layers=2, seed=3, eos_token_id=0)
    s = SamplingConfig(1.0)
    prompts = encode(tiny_tokenizer)
    rows = make_labeler((target, draft), tiny_tokenizer, s, max_new_tokens=16).label([0, 1, 2, 3], prompts)
    y = np.concatenate([r.draft_ids for r in rows])
    acc = np.concatenate([r.accept_prob for r in rows])
    assert (y >= vocab).any(), "the draft's extra tokens carry 1/6 of its mass; some must be drawn"
    assert (acc[y >= vocab] == 0).all()
    for row, prompt in zip(rows, prompts, strict=True):
        x, yy = row.response_ids.tolist(), torch.from_numpy(row.draft_ids).long()
        p = torch.nn.functional.pad(hf_probs(target, prompt, x, s), (0, 64))
        q = hf_probs(draft, prompt, x, s)
        expected = torch.clamp(p.gather(-1, yy[:, None]) / q.gather(-1, yy[:, None]), max=1).squeeze(-1)
        torch.testing.assert_close(torch.from_numpy(row.accept_prob), expected, atol=1e-5, rtol=1e-5)


def test_one_target_pass_labels_online(tiny_llama_pair, tiny_tokenizer):
    """The target runs once over the prompts and once per fed token: no second forward for the labels."""
    target, draft = tiny_llama_pair
    calls = record_forward_shapes(target, draft)
    prompts = encode(tiny_tokenizer)
    rows = make_labeler(tiny_llama_pair, tiny_tokenizer, SamplingConfig(0.9, 0, 0.95), eos_ids=[-1]).label(
        [0, 1, 2, 3], prompts
    )
    assert all(len(r.response_ids) == 10 for r in rows)
    width = max(len(p) for p in prompts)
    steps = [(4, width)] + [(4, 1)] * 9  # the prompts, then X_1..X_9 (X_10 is never fed)
    assert calls[target] == steps
    assert calls[draft] == [*steps, (4, width + 10)]  # the same steps, then the feature pass over prompt+Z


def test_target_token_outside_the_draft_vocabulary_is_refused(tiny_llama_pair, tiny_tokenizer):
    from conftest import make_tiny_llama

    from acchead.errors import AccheadError

    _, draft = tiny_llama_pair
    vocab = len(tiny_tokenizer)
    target = make_tiny_llama(vocab + 64, hidden_size=64, num_layers=2, seed=1, eos_token_id=0)
    labeler = make_labeler((target, draft), tiny_tokenizer, SamplingConfig(1.0), max_new_tokens=16)
    with pytest.raises(AccheadError, match=f"outside the draft's {vocab} embeddings"):
        labeler.label([0, 1, 2, 3], encode(tiny_tokenizer))
