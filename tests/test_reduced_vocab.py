"""The reduced-vocabulary draft: a drop-in causal LM whose q is zero outside its V_d tokens, saved and
loaded like any draft directory, and decoding with it stays exact (chi-square) and greedy-identical."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from test_exactness import _chi_square_p_value, _exact_sequences, _peaked_llama

from acchead.head import AcceptanceHead
from acchead.inference.decoder import SpeculativeDecoder
from acchead.models import load_causal_lm
from acchead.reduced_vocab import ReducedVocabConfig, ReducedVocabLlamaForCausalLM
from acchead.sampling import SamplingConfig

VOCAB, DRAFT_VOCAB = 12, 8
KEPT = torch.tensor([1, 4, 7, 0, 2, 9, 11, 5])  # the draft's rows, in this order; 3, 6, 8 and 10 are not


def _reduced_draft(seed: int = 5, init: float = 0.3) -> ReducedVocabLlamaForCausalLM:
    cfg = ReducedVocabConfig(
        draft_vocab_size=DRAFT_VOCAB, vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        initializer_range=init, bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = ReducedVocabLlamaForCausalLM(cfg).eval()
    model.model.embed_tokens.set_vocabulary(KEPT)
    return model


@pytest.fixture(scope="module")
def reduced_pair():
    return _peaked_llama(VOCAB, seed=3), _reduced_draft()


def test_q_is_zero_outside_the_vocabulary_and_one_table_is_stored(reduced_pair):
    _, draft = reduced_pair
    ids = torch.tensor([[3, 6, 1, 10, 4]])  # tokens outside the vocabulary are valid inputs
    logits = draft(input_ids=ids).logits  # (1, 5, V)
    outside = sorted(set(range(VOCAB)) - set(KEPT.tolist()))
    assert logits.shape == (1, 5, VOCAB) and torch.isinf(logits[..., outside]).all()
    assert torch.isfinite(logits[..., KEPT]).all()
    emb = draft.model.embed_tokens
    assert torch.equal(emb(torch.tensor([3])), emb(torch.tensor([6])))  # both the "other" row
    keys = draft.state_dict().keys()
    assert "model.embed_tokens.weight" in keys and not any(k.startswith("lm_head") for k in keys)
    with pytest.raises(ValueError, match="distinct token ids"):
        emb.set_vocabulary(torch.tensor([1, 1, 2, 3, 4, 5, 6, 7]))


def test_saves_and_loads_as_a_draft_directory(reduced_pair, tmp_path):
    _, draft = reduced_pair
    draft.save_pretrained(tmp_path)
    ids = torch.tensor([[1, 3, 8, 2]])
    loaded = load_causal_lm(tmp_path)
    assert type(loaded) is ReducedVocabLlamaForCausalLM
    assert torch.equal(loaded(input_ids=ids).logits, draft(input_ids=ids).logits)
    assert torch.equal(loaded.model.embed_tokens.to_full, KEPT)
    half = load_causal_lm(tmp_path, dtype="bf16")
    assert half.model.embed_tokens.weight.dtype == torch.bfloat16
    assert half.model.embed_tokens.to_draft.dtype == torch.long  # the id maps are never cast


@pytest.mark.parametrize("fast", [False, True], ids=["eager", "fast"])
@pytest.mark.parametrize(("spec", "verifier"), [("specdec:k=2", "token"), ("specdecpp:h=0.5,max=3", "block")])
def test_sampling_stays_exact(reduced_pair, spec, verifier, fast):
    """The target puts mass on tokens the draft can never propose: the residual must put it back."""
    target, draft = reduced_pair
    dec = SpeculativeDecoder(target, draft, policy=spec, head=AcceptanceHead(32, depth=1), verifier=verifier,
                             fast=fast, compile=False)  # fmt: skip
    cfg, prompt, n = SamplingConfig(1.0), [1, 4], 250
    exact = _exact_sequences(target, prompt, 3, cfg)
    assert sum(p for seq, p in exact.items() if set(seq) - set(KEPT.tolist())) > 0.1  # the case is real
    counts = Counter(
        tuple(dec.generate(torch.tensor(prompt), max_new_tokens=3, temperature=1.0, seed=s).new_ids.tolist())
        for s in range(n)
    )
    assert _chi_square_p_value(counts, exact, n) > 1e-3


@pytest.mark.parametrize("fast", [False, True], ids=["eager", "fast"])
@pytest.mark.parametrize("spec", ["specdec:k=4", "specdecpp:h=0.5,max=6", "confidence:tau=0.6,max=8"])
def test_greedy_equals_the_targets_greedy(reduced_pair, spec, fast):
    target, draft = reduced_pair
    dec = SpeculativeDecoder(target, draft, policy=spec, head=AcceptanceHead(32, depth=1), fast=fast,
                             compile=False)  # fmt: skip
    prompt = torch.tensor([[1, 4, 7]])
    ref = target.generate(prompt, max_new_tokens=24, do_sample=False, pad_token_id=0)
    res = dec.generate(prompt, max_new_tokens=24, temperature=0)
    assert res.new_ids.tolist() == ref[0, 3:].tolist()
