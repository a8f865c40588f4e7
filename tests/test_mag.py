"""Max-Gram (DESIGN §6): suffix matching, the bigram table, the Drafter, and exact greedy decoding with it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from acchead.errors import AccheadError
from acchead.inference.decoder import SpeculativeDecoder
from acchead.inference.drafters import Drafter
from acchead.inference.mag import (
    MaGDrafter,
    MaxGram,
    _scan_suffix_match,
    build_bigram_table,
    corpus_bigram_table,
    longest_suffix_match,
)
from acchead.sampling import SamplingConfig


def test_longest_suffix_match_is_longest_then_leftmost():
    #                0  1  2  3  4  5  6  7  8  9 10 11 12
    s = np.array([5, 1, 2, 3, 9, 1, 2, 3, 7, 4, 1, 2, 3])
    # suffix [1,2,3] occurs ending at 3 and at 7; [3,1,2,3]/[4,1,2,3] occur nowhere earlier
    assert longest_suffix_match(s) == (3, 3)
    assert longest_suffix_match(s, start=4) == (3, 7)  # the first occurrence is before `start`
    assert longest_suffix_match(np.array([1, 2, 3, 4])) is None  # last token never seen before
    assert longest_suffix_match(np.array([7, 7, 7])) == (2, 1)  # overlapping occurrence


def test_hashed_search_agrees_with_the_token_by_token_scan():
    """Long (periodic) matches take the rolling-hash binary search; it must find the same match."""
    rng = np.random.default_rng(0)
    for trial in range(400):
        if trial % 2:  # periodic text with a random head: matches of hundreds of tokens
            period = rng.integers(0, 50, size=int(rng.integers(1, 12)))
            s = np.concatenate([rng.integers(0, 50, size=int(rng.integers(0, 30))), np.tile(period, 40)])
        else:  # small alphabet: many short matches and ties
            s = rng.integers(0, int(rng.integers(2, 5)), size=int(rng.integers(2, 120)))
        start = int(rng.integers(0, s.size))
        assert longest_suffix_match(s, start) == _scan_suffix_match(s, start), (s.tolist(), start)


def test_bigram_table_counts_ties_and_unseen_tokens():
    table = build_bigram_table([[1, 2, 3, 1, 2, 4], np.array([0])], vocab_size=6)
    # 1 -> 2 twice; 2 -> 3 and 2 -> 4 tie (smaller id wins); 3 -> 1; 0, 4, 5 unseen as predecessors ->
    # the most frequent successor overall (2).
    assert table.tolist() == [2, 2, 3, 1, 2, 2]
    with pytest.raises(AccheadError):
        build_bigram_table([[1]], vocab_size=6)
    with pytest.raises(AccheadError):
        build_bigram_table([[1, 9]], vocab_size=6)


def test_propose_copies_then_searches_generated_text_then_fills_from_bigrams():
    mag = MaxGram(build_bigram_table([[1, 2, 3, 1, 2, 4]], vocab_size=10))
    s = [5, 1, 2, 3, 9, 1, 2, 3, 7, 4, 1, 2, 3]
    # the match ending at index 3 is followed by 9, 1, 2, 3, 7, 4
    assert mag.propose(s, prompt_len=4, n=6) == [9, 1, 2, 3, 7, 4]
    # [1, 2] matches at 0..1 -> [1, 2]; extended text [1,2,1,2,1,2] searched within generated text
    # (from index 2) -> [1, 2]; then the bigram 2 -> 3.
    assert mag.propose([1, 2, 1, 2], prompt_len=2, n=5) == [1, 2, 1, 2, 3]
    # nothing to copy: bigram chain 8 -> 2 (fallback) -> 3 -> 1
    assert mag.propose([8], prompt_len=1, n=3) == [2, 3, 1]
    assert mag.propose(np.array([5, 1, 2, 3, 9, 1, 2, 3]), 8, 0) == []


def test_corpus_table_is_built_once_and_cached(tmp_path, tiny_tokenizer):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("def f(x):\n    return x + 1\n")
    b.write_text("def g(y):\n    return y * 2\n")
    t1 = corpus_bigram_table(tiny_tokenizer, cache_dir=tmp_path / "cache", files=[a, b])
    cached = list((tmp_path / "cache").glob("mag-bigram-*.npy"))
    assert len(cached) == 1 and t1.shape == (len(tiny_tokenizer),)
    ids = tiny_tokenizer([a.read_text(), b.read_text()])["input_ids"]
    np.testing.assert_array_equal(t1, build_bigram_table(ids, len(tiny_tokenizer)))
    np.save(cached[0], np.zeros_like(t1))  # a second call must read the cache, not rebuild
    t2 = corpus_bigram_table(tiny_tokenizer, cache_dir=tmp_path / "cache", files=[a, b])
    assert (t2 == 0).all()


def test_corpus_table_defaults_to_the_user_cache(tmp_path, monkeypatch, tiny_tokenizer):
    # One cache for the whole project: $ACCHEAD_CACHE_DIR moves the bigram tables with the prompt sets.
    a = tmp_path / "a.py"
    a.write_text("def f(x):\n    return x + 1\n")
    monkeypatch.setenv("ACCHEAD_CACHE_DIR", str(tmp_path / "user-cache"))
    corpus_bigram_table(tiny_tokenizer, files=[a])
    assert len(list((tmp_path / "user-cache").glob("mag-bigram-*.npy"))) == 1


def test_drafter_protocol_one_hot_q_and_block_reuse():
    mag = MaxGram(build_bigram_table([[1, 2, 3, 1, 2, 4]], vocab_size=10))
    d = MaGDrafter(mag, vocab_size=12, block=3)
    assert isinstance(d, Drafter)
    prompt = torch.tensor([5, 1, 2, 3, 9, 1, 2, 3])
    d.begin(prompt, SamplingConfig(temperature=0), 0)
    ctx = prompt.clone()
    got = []
    for i in range(1, 6):  # runs past the 3-token block: a new block from the longer context
        step = d.propose(ctx, i, want_hidden=False)
        assert step.hidden is None and step.index == i
        assert step.q.shape == (12,) and step.q.sum() == 1 and step.q[step.token] == 1
        got.append(step.token)
        ctx = torch.cat([ctx, torch.tensor([step.token])])
    assert got[:3] == mag.propose(prompt.numpy(), 8, 3)
    assert got[3:] == mag.propose(ctx[:-2].numpy(), 8, 3)[:2]
    assert d.draft_calls == 0
    with pytest.raises(AccheadError):
        MaGDrafter(mag, vocab_size=5)


def _greedy(model, prompt: torch.Tensor, n: int) -> list[int]:
    out = model.generate(prompt[None], max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, prompt.numel():].tolist()


def test_greedy_decoding_with_mag_equals_target_greedy(tiny_llama_pair):
    target, _ = tiny_llama_pair
    vocab = target.config.vocab_size
    rng = np.random.default_rng(0)
    corpus = [rng.integers(1, vocab, size=200)]
    mag = MaxGram(build_bigram_table(corpus, vocab))
    prompt = torch.tensor([5, 17, 40, 5, 17, 40, 5, 17, 40, 5])  # repetitive: MaG copies it
    want = _greedy(target, prompt, 24)
    dec = SpeculativeDecoder(target, MaGDrafter(mag, vocab, block=6), policy="specdec:k=6")
    res = dec.generate(prompt, max_new_tokens=24, temperature=0)
    assert res.new_ids.tolist() == want
    assert res.draft_calls == 0 and res.drafted > 0
