"""acchead.kv_decode: the one KV-cached decode loop, checked against full recomputation without a cache."""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_llama

from acchead.errors import AccheadError
from acchead.kv_decode import KVSequence, decode, greedy, position_ids

VOCAB = 96


@pytest.fixture
def llama():
    """A tiny random 2-layer Llama (seeded); eos 0."""
    return make_tiny_llama(VOCAB, hidden_size=32, num_layers=2, seed=7)


def _recompute_greedy(model, prompt: list[int], n: int, eos: int | None = None) -> list[int]:
    """Greedy decoding by a full forward over prompt + output at every step (no cache)."""
    out: list[int] = []
    with torch.no_grad():
        for _ in range(n):
            logits = model(input_ids=torch.tensor([prompt + out])).logits[0, -1]
            out.append(int(logits.argmax()))
            if out[-1] == eos:
                break
    return out


def test_greedy_equals_a_full_recompute_without_cache(llama):
    seq = KVSequence(llama)
    seq.feed(torch.tensor([[3, 14, 15, 9, 26]]))
    got = decode(seq, 12, greedy)
    assert got.tolist() == [_recompute_greedy(llama, [3, 14, 15, 9, 26], 12)]
    assert seq.length == 5 + 11  # the last token is not fed


def test_left_padded_batch_equals_each_prompt_alone(llama):
    """A batch of left-padded prompts decodes what each prompt decodes alone (positions count real tokens),
    and a follower fed the same tokens holds its own model's next-token logits."""
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12], [40, 41, 42]]
    width = max(map(len, prompts))
    ids = torch.tensor([[1] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    assert position_ids(mask)[1].tolist() == [0, 0, 0, 0, 0, 1]
    follower_model = make_tiny_llama(VOCAB, hidden_size=16, num_layers=2, seed=8)
    seq, follower = KVSequence(llama), KVSequence(follower_model)
    seq.feed(ids, mask=mask)
    follower.feed(ids, mask=mask)
    got = decode(seq, 8, greedy, followers=(follower,), feed_last=True)
    for b, p in enumerate(prompts):
        alone = _recompute_greedy(llama, p, 8)
        assert got[b].tolist() == alone
        with torch.no_grad():
            full = follower_model(input_ids=torch.tensor([p + alone])).logits[0, -1]
        torch.testing.assert_close(follower.logits[b], full, rtol=1e-4, atol=1e-4)


def test_rows_stop_at_eos_and_are_padded_after_it(llama):
    prompt = [3, 14, 15]
    free = _recompute_greedy(llama, prompt, 10)
    eos = free[3]  # the fourth token ends the first row
    first_at = free.index(eos)
    seq = KVSequence(llama)
    seq.feed(torch.tensor([prompt, prompt]))
    calls = []

    def choose(t: int, logits: torch.Tensor) -> torch.Tensor:
        calls.append(t)
        return logits.argmax(-1)

    got = decode(seq, 10, choose, eos_ids={eos}, pad_id=2)
    assert got.shape == (2, first_at + 1) and calls == list(range(first_at + 1))  # all rows ended: stop
    assert got[0].tolist() == free[: first_at + 1]


def test_finished_rows_are_fed_the_pad_token(llama):
    """Row 0 ends at its first token (its EOS); row 1 goes on, row 0 is fed `pad_id` meanwhile."""
    seq = KVSequence(llama)
    seq.feed(torch.tensor([[3, 14], [3, 14]]))
    first = int(seq.logits[0].argmax())
    picks = iter([torch.tensor([first, 5]), torch.tensor([7, 8]), torch.tensor([9, 10])])
    got = decode(seq, 3, lambda t, logits: next(picks), eos_ids=[first], pad_id=2)
    assert got.tolist() == [[first, 2, 2], [5, 8, 10]]


def test_a_token_outside_a_models_embeddings_is_refused(llama):
    narrow = make_tiny_llama(8, hidden_size=16, num_layers=2, seed=3)
    seq, follower = KVSequence(llama), KVSequence(narrow, "the draft")
    seq.feed(torch.tensor([[3, 4]]))
    follower.feed(torch.tensor([[3, 4]]))
    with pytest.raises(AccheadError, match="decoded token 50, outside the draft's 8 embeddings"):
        decode(seq, 4, lambda t, logits: torch.tensor([50]), followers=(follower,))


def test_crop_rolls_back_and_a_mask_only_comes_first(llama):
    seq = KVSequence(llama)
    seq.feed(torch.tensor([[3, 14, 15, 9]]))
    seq.feed(torch.tensor([[60, 61]]))
    seq.crop(4)
    assert seq.length == 4 and seq.cache.get_seq_length() == 4
    logits, hidden = seq.feed(torch.tensor([[26]]), want_hidden=True)
    with torch.no_grad():
        full = llama(input_ids=torch.tensor([[3, 14, 15, 9, 26]])).logits[0, -1]
    torch.testing.assert_close(logits[0, -1], full, rtol=1e-4, atol=1e-4)
    assert hidden.shape == (1, 32)
    with pytest.raises(ValueError, match="first feed only"):
        seq.feed(torch.tensor([[1]]), mask=torch.ones(1, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="prefilled"):
        decode(KVSequence(llama), 3)


def test_padded_crop_keeps_positions(llama):
    """Cropping a left-padded batch and feeding again equals feeding the kept tokens in the first place."""
    ids = torch.tensor([[1, 1, 5, 6], [7, 8, 9, 10]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    a, b = KVSequence(llama), KVSequence(llama)
    a.feed(ids, mask=mask)
    a.feed(torch.tensor([[20, 21, 22], [23, 24, 25]]))
    a.crop(5)
    a.feed(torch.tensor([[30], [31]]))
    b.feed(ids, mask=mask)
    b.feed(torch.tensor([[20, 30], [23, 31]]))
    torch.testing.assert_close(a.logits, b.logits, rtol=1e-4, atol=1e-4)
    assert greedy(0, a.logits).tolist() == greedy(0, b.logits).tolist()
