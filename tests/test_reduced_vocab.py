"""The reduced-vocabulary draft: a drop-in causal LM whose q is zero outside its V_d tokens, saved without
the target's embedding and loaded with it, and decoding with it stays exact (chi-square) and
greedy-identical on both paths."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import torch
from exact_models import _chi_square_p_value, _exact_sequences, _peaked_llama

from acchead.errors import AccheadError
from acchead.head import AcceptanceHead
from acchead.inference.decoder import SpeculativeDecoder
from acchead.models import load_causal_lm, model_identity
from acchead.reduced_vocab import ReducedVocabConfig, ReducedVocabLlamaForCausalLM, embedding_fingerprint
from acchead.sampling import SamplingConfig

VOCAB, DRAFT_VOCAB = 12, 8
KEPT = torch.tensor([1, 4, 7, 0, 2, 9, 11, 5])  # the draft's rows, in this order; 3, 6, 8 and 10 are not


def _reduced_draft(target, seed: int = 5, init: float = 0.3, source: str | None = None):
    """A random reduced draft reading `target`'s embedding, head rows KEPT."""
    emb = target.get_input_embeddings().weight
    cfg = ReducedVocabConfig(
        draft_vocab_size=DRAFT_VOCAB, vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        initializer_range=init, bos_token_id=0, eos_token_id=0, pad_token_id=0,
        embedding_source=source, embedding_fingerprint=embedding_fingerprint(emb),
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = ReducedVocabLlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.get_input_embeddings().weight.copy_(emb)
    model.lm_head.set_vocabulary(KEPT)
    return model


@pytest.fixture(scope="module")
def reduced_pair():
    target = _peaked_llama(VOCAB, seed=3)
    return target, _reduced_draft(target)


def test_q_is_zero_outside_the_vocabulary(reduced_pair):
    _, draft = reduced_pair
    ids = torch.tensor([[3, 6, 1, 10, 4]])  # tokens outside the head's vocabulary are ordinary inputs
    logits = draft(input_ids=ids).logits  # (1, 5, V)
    outside = sorted(set(range(VOCAB)) - set(KEPT.tolist()))
    assert logits.shape == (1, 5, VOCAB) and torch.isinf(logits[..., outside]).all()
    assert torch.isfinite(logits[..., KEPT]).all()
    assert draft.lm_head.to_draft[KEPT].tolist() == list(range(DRAFT_VOCAB))
    assert (draft.lm_head.to_draft[outside] == -1).all()
    with pytest.raises(ValueError, match="distinct token ids"):
        draft.lm_head.set_vocabulary(torch.tensor([1, 1, 2, 3, 4, 5, 6, 7]))


def test_saved_without_the_embedding_and_loaded_with_it(reduced_pair, tmp_path):
    target, draft = reduced_pair
    target.save_pretrained(tmp_path / "target")
    draft.config.embedding_source = "../target"  # relative to the draft's directory
    draft.save_pretrained(tmp_path / "draft")
    from safetensors import safe_open

    with safe_open(tmp_path / "draft" / "model.safetensors", framework="pt") as st:
        assert "model.embed_tokens.weight" not in st.keys()  # noqa: SIM118
    ids = torch.tensor([[1, 3, 8, 2]])
    loaded = load_causal_lm(tmp_path / "draft")
    assert type(loaded) is ReducedVocabLlamaForCausalLM
    assert torch.equal(loaded(input_ids=ids).logits, draft(input_ids=ids).logits)
    assert torch.equal(loaded.lm_head.to_full, KEPT)
    half = load_causal_lm(tmp_path / "draft", dtype="bf16")
    assert half.lm_head.weight.dtype == half.get_input_embeddings().weight.dtype == torch.bfloat16
    # a head records its draft by fingerprint: the same across dtypes, another for another reduced draft of
    # the same target (the input embedding, the target's, cannot tell them apart; the head rows do)
    mine = model_identity(draft)["fingerprint"]
    assert model_identity(half)["fingerprint"] == mine
    assert model_identity(_reduced_draft(target, seed=6))["fingerprint"] != mine
    assert half.lm_head.to_draft.dtype == torch.long  # the id maps are never cast
    other = _peaked_llama(VOCAB, seed=9)
    other.save_pretrained(tmp_path / "target", safe_serialization=True)  # another target's embedding
    with pytest.raises(AccheadError, match="not the one this draft was trained with"):
        load_causal_lm(tmp_path / "draft")


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


def test_output_embedding_table_places_the_head_rows(reduced_pair):
    from acchead.models import output_embedding_table

    target, draft = reduced_pair
    table = output_embedding_table(draft)  # (V, H)
    assert table.shape == (VOCAB, 32) and torch.equal(table[KEPT], draft.lm_head.weight.detach())
    outside = [t for t in range(VOCAB) if t not in KEPT.tolist()]
    assert table[outside].eq(0).all()
    assert output_embedding_table(target).data_ptr() == target.get_output_embeddings().weight.data_ptr()


def test_gen_data_and_training_take_a_reduced_draft(tiny_pair_dirs, tiny_tokenizer, tmp_path):
    """gen-data caches the (V, H) token table (the head's rows at their ids), a lookahead head reading the
    token trains on it; one reading log q and the entropy from the cached states gets the draft's own (its
    logits are -inf outside the head rows, not the 0 that the zero rows of the table would give)."""
    from acchead.data_gen import cli as gen_cli
    from acchead.distill.draft import init_from_target
    from acchead.train import cli as train_cli

    target_dir, _ = tiny_pair_dirs
    target = load_causal_lm(target_dir)
    vocab = torch.arange(len(tiny_tokenizer))[::2].contiguous()  # every other token
    draft = init_from_target(target, vocab, (1,), str(target_dir))
    draft.save_pretrained(tmp_path / "draft")
    tiny_tokenizer.save_pretrained(tmp_path / "draft")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"def f{i}(x):"}) + "\n" for i in range(6)))
    data = tmp_path / "data"
    assert gen_cli.main(["--target", str(target_dir), "--draft", str(tmp_path / "draft"), "--prompts",
                         str(prompts), "--max-new-tokens", "8", "--out", str(data)]) == 0  # fmt: skip
    assert np.load(data / "token_embeddings.npy").shape == (len(tiny_tokenizer), 64)
    card = ["--data", str(data), "--w-rej", "6", "--depth", "3"]
    assert train_cli.main([*card, "--out", str(tmp_path / "h")]) == 0  # state+token
    assert train_cli.main([*card, "--inputs", "state+logq+entropy", "--out", str(tmp_path / "h2")]) == 0

    from acchead.lookahead import candidate_stats, feature_logprobs
    from acchead.sampling import SamplingConfig
    from acchead.train.data import load_gen_data
    from acchead.train.datamodule import CachedPositions

    gd = load_gen_data(data, "cached", "lookahead")
    cached = CachedPositions(gd, ("state", "logq", "entropy"))
    state = torch.from_numpy(np.ascontiguousarray(gd.features[gd.feature_index])).float()
    logits = draft.lm_head(state)  # (N, V), -inf outside the head rows
    assert torch.isinf(logits).any()
    want = candidate_stats(feature_logprobs(logits, SamplingConfig(0.0)), torch.from_numpy(gd.candidate),
                           ("logq", "entropy"))  # fmt: skip
    # float16 rounding of the cached table only; zeros instead of -inf would move the entropy by whole nats
    torch.testing.assert_close(cached.stats, want, rtol=5e-3, atol=1e-2)
    # computed in chunks of positions (to bound the (chunk, V) logits in memory): the chunking changes nothing
    chunked = cached._stats(SamplingConfig(0.0), chunk=3)
    assert len(gd.labels) > 3
    torch.testing.assert_close(chunked, cached.stats, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("greedy", [True, False])
def test_head_statistics_over_the_head_rows_equal_the_full_vocabulary_ones(reduced_pair, greedy):
    """A head reading log q, the entropy and the top log-probs computes them over the draft's V_d head rows
    (`HeadCall`), not the full vocabulary where every other entry is -inf (q = 0): the same input vector,
    ~6x cheaper on the real pair's 8,192 of 49,152, for a token held as a host int or as a tensor."""
    from acchead.head import AcceptanceHead
    from acchead.inference.drafters import DraftStep
    from acchead.inference.head_call import HeadCall

    _, draft = reduced_pair
    head = AcceptanceHead(32, depth=1, kind="lookahead", inputs=("state", "logq", "entropy", "topk"))
    reduced, full = HeadCall(head), HeadCall(head)
    reduced.attach_draft(draft)
    assert reduced._vocab is not None and full._vocab is None
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        state = torch.randn(32, generator=g)
        logits = draft.lm_head(state)  # (V,), -inf outside KEPT
        q = torch.softmax(logits / 0.7, -1)
        token = int(KEPT[int(torch.randint(0, DRAFT_VOCAB, (1,), generator=g))])
        kept = logits if greedy else None  # greedy decoders keep the logits (q is one-hot), sampling q
        step = DraftStep(token=token, q=q, hidden=None, index=1, logits=kept, state=state)
        want = full.input(step)
        torch.testing.assert_close(reduced.input(step), want, rtol=1e-5, atol=1e-5)
        # a token held on the device (compiled units, the device path) is gathered, not read to the host
        on_device = DraftStep(token=torch.tensor(token), q=q, hidden=None, index=1, logits=kept, state=state)
        torch.testing.assert_close(reduced.input(on_device), want, rtol=1e-5, atol=1e-5)
