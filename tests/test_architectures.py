"""Pairs of other architectures than Llama decode exactly: tiny random Qwen 2, Qwen 3, Mistral, Gemma 2,
Phi 3, SmolLM3 and GPT-2 targets, each with a copy of itself under 10% noise as its draft (rounds then both
accept and reject).

Mistral and Gemma 2 are built with a sliding window of 16 tokens and decode 60 past a prompt, so every
path runs past the window: there the fast path's static cache once held the window alone (a rollback
could not restore what it had rolled out) and a ragged batch's holes stretched the window, which
transformers measures in cache slots (`acchead.attention_window`); both decoded other tokens than the
target's. The fast path runs uncompiled here (the same cache logic); compiled: the slow test below.
"""

from __future__ import annotations

import pytest
import torch
import transformers as tf
from exact_models import _perturbed

from acchead.attention_window import sliding_windows, window_mask
from acchead.errors import AccheadError
from acchead.head import AcceptanceHead
from acchead.inference import SpeculativeDecoder
from acchead.inference.batched import BatchedDecoder
from acchead.lm_forward import head_logits, splits_cleanly

VOCAB, WINDOW, NEW = 96, 16, 60
PROMPTS = [[5, 9, 17, 33, 2, 44, 61], [7, 1, 4], [*range(11, 31)]]  # the last one longer than the window
# Sizes as most configs name them; GPT-2 names its own. The initialiser's range is one at which each
# random model's greedy text varies and a draft with 10% noise agrees with it in some rounds, not all.
_SIZES = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "max_position_embeddings": 256, "initializer_range": 0.3}  # fmt: skip
_GPT2_SIZES = {"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 256, "initializer_range": 0.3}
ARCHS = {
    "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM, _SIZES),
    "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM, _SIZES),  # Qwen 2's layers with q and k normed per head
    "mistral": (tf.MistralConfig, tf.MistralForCausalLM, {**_SIZES, "sliding_window": WINDOW}),
    "gemma2": (tf.Gemma2Config, tf.Gemma2ForCausalLM,
               {**_SIZES, "head_dim": 8, "sliding_window": WINDOW, "initializer_range": 0.05}),
    "phi3": (tf.Phi3Config, tf.Phi3ForCausalLM, _SIZES),
    # four layers: the last one without rotary positions (SmolLM3's NoPE layers, one in four)
    "smollm3": (tf.SmolLM3Config, tf.SmolLM3ForCausalLM, {**_SIZES, "num_hidden_layers": 4}),
    "gpt2": (tf.GPT2Config, tf.GPT2LMHeadModel, _GPT2_SIZES),
}


def _target(name: str):
    config_class, model_class, sizes = ARCHS[name]
    cfg = config_class(vocab_size=VOCAB, bos_token_id=0, eos_token_id=0, pad_token_id=0, **sizes)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        return model_class(cfg).eval()


@pytest.fixture(scope="module", params=list(ARCHS))
def pair(request):
    target = _target(request.param)
    return target, _perturbed(target, 0.1, seed=2)


@pytest.fixture(scope="module")
def greedy_texts(pair) -> list[list[int]]:
    """The target's greedy continuation of each of PROMPTS (transformers' `generate`)."""
    return [_greedy(pair[0], p, NEW) for p in PROMPTS]


def _head(draft) -> AcceptanceHead:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return AcceptanceHead(draft.config.hidden_size, depth=1)


def _greedy(target, prompt: list[int], n: int) -> list[int]:
    out = target.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None,
                          pad_token_id=0)  # fmt: skip
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("fast", [False, True], ids=["eager", "fast"])
@pytest.mark.parametrize("policy", ["specdec:k=3", "specdecpp:h=0.5,max=4"])
def test_greedy_equals_the_targets_one_prompt_and_a_batch(pair, greedy_texts, policy, fast):
    """One prompt and a ragged batch of three: every row is the target's greedy continuation."""
    target, draft = pair
    target.generation_config.eos_token_id = draft.generation_config.eos_token_id = None  # decode all NEW
    want = greedy_texts
    one = SpeculativeDecoder(target, draft, policy=policy, head=_head(draft), fast=fast, compile=False)
    res = one.generate(torch.tensor(PROMPTS[0]), max_new_tokens=NEW, temperature=0)
    assert res.new_ids.tolist() == want[0]
    assert res.accepted_per_round.count(0) > 0 < sum(res.accepted_per_round)  # rounds reject and accept
    batch = BatchedDecoder(target, draft, policy, head=_head(draft), fast=fast, compile=False)
    res = batch.generate([torch.tensor(p) for p in PROMPTS], max_new_tokens=NEW, temperature=0)
    assert [r.new_ids.tolist() for r in res.rows] == want


# The other methods the papers describe, built as `acchead-decode` builds them (eagerly): block verification,
# a stop rule without a head, copy rounds, Max-Gram, a cascade, bandits over stop rules and over drafters.
# (Entropy and AdaEDL stop where confidence does, from the draft's q: nothing of theirs meets the model.)
METHODS = [
    ("specdec:k=3", "block"), ("specdecpp:h=0.5,max=4", "block"), ("confidence:tau=0.4,max=4", "token"),
    ("copy:min=2+specdec:k=3", "token"), ("mag+specdec:k=4", "token"),
    ("cascade:k=3.1/4+specdec:k=4", "token"),
    ("exp3:seed=0,arms=specdec:k=1|specdecpp:h=0.5,max=4", "token"),
    ("ucb:arms=specdec:k=2|mag:block=6@specdec:k=6|cascade:k=3.1/4@specdec:k=4", "token"),
]  # fmt: skip


@pytest.mark.parametrize(("method", "verifier"), METHODS, ids=[f"{m}-{v}" for m, v in METHODS])
def test_every_method_decodes_the_targets_greedy_text(pair, greedy_texts, method, verifier, tmp_path):
    """Each method on each architecture: one prompt (the long one, past Mistral's and Gemma 2's window)
    decodes the target's greedy text; block verification and copy rounds a ragged batch too (the batched
    decoder's other stop rules meet the models as specdecpp does, above)."""
    import numpy as np

    from acchead.head_io import HeadMetadata, save_head
    from acchead.inference.decoder_factory import build_decoder
    from acchead.inference.drafter_spec import CopySpec
    from acchead.inference.mag import build_bigram_table
    from acchead.inference.spec import DecodingSpec
    from acchead.sampling import SamplingConfig

    target, draft = pair
    target.generation_config.eos_token_id = draft.generation_config.eos_token_id = None
    hidden = draft.config.hidden_size
    meta = HeadMetadata(depth=1, hidden_size=hidden, w_acc=1.0, w_rej=6.0, draft={"hidden_size": hidden},
                        sampling=SamplingConfig(0.0).to_dict())  # fmt: skip
    head = str(save_head(_head(draft), tmp_path / "head.safetensors", meta=meta))
    spec = DecodingSpec.from_spec(method, verifier=verifier, head=head)
    bigram = build_bigram_table([np.random.default_rng(0).integers(0, VOCAB, 300)], VOCAB)
    decoder = build_decoder(spec, target, draft, bigram=bigram, compile=False)
    res = decoder.generate(torch.tensor(PROMPTS[2]), max_new_tokens=NEW, temperature=0)
    assert res.new_ids.tolist() == greedy_texts[2]
    assert res.rounds < NEW  # some round accepted a candidate
    if verifier == "block" or isinstance(spec.drafter, CopySpec):
        batch = BatchedDecoder(target, draft, spec=spec, compile=False)
        res = batch.generate([torch.tensor(p) for p in PROMPTS], max_new_tokens=NEW, temperature=0)
        assert [r.new_ids.tolist() for r in res.rows] == greedy_texts


@pytest.mark.parametrize("name", ["mistral", "gemma2"])
def test_a_sampled_batch_row_is_the_row_decoded_alone(name):
    """At T = 1 a row of a batch (without the batch rule) draws what the single-prompt decoder draws with
    the same seed, past the window: its mask by position lets it see exactly the keys it sees alone."""
    target = _target(name)
    draft = _perturbed(target, 0.1, seed=2)
    target.generation_config.eos_token_id = draft.generation_config.eos_token_id = None
    batch = BatchedDecoder(target, draft, "specdec:k=3")
    seeds = [3, 4, 5]
    res = batch.generate([torch.tensor(p) for p in PROMPTS], max_new_tokens=NEW, temperature=1.0, seed=seeds)
    alone = SpeculativeDecoder(target, draft, policy="specdec:k=3")
    for row, prompt, seed in zip(res.rows, PROMPTS, seeds, strict=True):
        want = alone.generate(torch.tensor(prompt), max_new_tokens=NEW, temperature=1.0, seed=seed)
        assert row.new_ids.tolist() == want.new_ids.tolist()


def test_chi_square_of_a_sliding_window_row_under_the_batch_rule():
    """A peaked Mistral of window 4 (12 tokens): row 1 of a ragged batch of three, its prompt past the
    window, with the batch rule (c = 0.3) ending rounds from every row's head: its 3-token continuations
    follow the target's exact distribution (transformers' own forward over whole sequences). A mask whose
    window is 2 tokens too wide fails it (checked once, by hand)."""
    from collections import Counter

    from exact_models import _chi_square_p_value, _exact_sequences

    from acchead.sampling import SamplingConfig

    cfg = tf.MistralConfig(vocab_size=12, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                           initializer_range=0.3, sliding_window=4, tie_word_embeddings=False)  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        target = tf.MistralForCausalLM(cfg).eval()
    draft = _perturbed(target, 0.5, seed=4)
    head = AcceptanceHead(draft.config.hidden_size, depth=1)
    dec = BatchedDecoder(target, draft, "specdecpp:h=0.5,max=3", head=head, batch_stop=0.3)
    prompts, samples, counts, stops = [[3, 5], [1, 4, 2, 6, 3, 5], [2, 7, 7]], 250, Counter(), 0
    for s in range(samples):
        res = dec.generate(prompts, max_new_tokens=[5, 3, 4], temperature=1.0, seed=[7 * s, s, 3 * s + 1])
        counts[tuple(res.rows[1].new_ids.tolist())] += 1
        stops += res.batch_stops
    assert stops > 0  # the rule really ended rounds
    exact = _exact_sequences(target, prompts[1], 3, SamplingConfig(1.0))
    assert _chi_square_p_value(counts, exact, samples) > 1e-3


def _peaked_target(name: str):
    """`name`'s tiny target on 12 tokens, whose next-token laws are peaked enough for a chi-square test of
    3-token continuations. Gemma 2's logit soft cap is 2 (its default, 30, never binds on these logits and
    greedy text cannot see it): a decoder that dropped the cap samples another law (p = 0, checked once by
    hand with `head_logits` uncapped and the split forced)."""
    config_class, model_class, sizes = ARCHS[name]
    extra = {"final_logit_softcapping": 2.0} if name == "gemma2" else {}
    cfg = config_class(vocab_size=12, bos_token_id=0, eos_token_id=0, pad_token_id=0,
                       tie_word_embeddings=False, **{**sizes, "initializer_range": 0.3}, **extra)  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        return model_class(cfg).eval()


@pytest.mark.parametrize("name", list(ARCHS))
def test_chi_square_of_each_architecture(name):
    """At T = 1, SpecDec++ with block verification on the fast path (static caches, the split forward):
    3-token continuations follow the target's exact law (transformers' own forward over whole sequences),
    and the draft's law, sampled as often, is rejected (the test has power on this pair). The eager path
    drew the same 250 sequences as the fast one on every architecture (checked once by hand); its greedy
    text is tested above."""
    from collections import Counter

    from exact_models import _chi_square_p_value, _draws, _exact_sequences

    from acchead.sampling import SamplingConfig

    target = _peaked_target(name)
    draft = _perturbed(target, 0.5, seed=4)
    target.generation_config.eos_token_id = draft.generation_config.eos_token_id = None
    dec = SpeculativeDecoder(target, draft, policy="specdecpp:h=0.5,max=3", head=_head(draft),
                             verifier="block", fast=True, compile=False)  # fmt: skip
    prompt, samples, cfg = [1, 4], 250, SamplingConfig(1.0)
    counts = Counter(
        tuple(dec.generate(torch.tensor(prompt), max_new_tokens=3, temperature=1.0, seed=s).new_ids.tolist())
        for s in range(samples)
    )
    exact = _exact_sequences(target, prompt, 3, cfg)
    assert _chi_square_p_value(counts, exact, samples) > 1e-3
    drafted = _draws(_exact_sequences(draft, prompt, 3, cfg), samples)  # the draft's own law
    assert _chi_square_p_value(drafted, exact, samples) < 1e-3


def test_chi_square_of_a_gemma2_batch_row_with_its_soft_cap():
    """Row 1 of a ragged batch of three on the fast path (the ragged static cache's own split forward),
    Gemma 2 with its soft cap at 2: its 3-token continuations follow the target's law (p = 0 with the cap
    dropped, checked once by hand)."""
    from collections import Counter

    from exact_models import _chi_square_p_value, _exact_sequences

    from acchead.sampling import SamplingConfig

    target = _peaked_target("gemma2")
    draft = _perturbed(target, 0.5, seed=4)
    target.generation_config.eos_token_id = draft.generation_config.eos_token_id = None
    dec = BatchedDecoder(target, draft, "specdecpp:h=0.5,max=3", head=_head(draft), verifier="block",
                         fast=True, compile=False)  # fmt: skip
    prompts, samples, counts = [[3, 5], [1, 4], [2, 7, 7, 1, 9]], 250, Counter()
    for s in range(samples):
        res = dec.generate(prompts, max_new_tokens=[5, 3, 4], temperature=1.0, seed=[7 * s, s, 3 * s + 1])
        counts[tuple(res.rows[1].new_ids.tolist())] += 1
    exact = _exact_sequences(target, prompts[1], 3, SamplingConfig(1.0))
    assert _chi_square_p_value(counts, exact, samples) > 1e-3


def test_sliding_windows_read_transformers_layer_kinds():
    """None for full attention everywhere; Mistral's one window for every layer; Gemma 2's per layer type;
    a layer kind neither full nor sliding (Llama 4's chunks) is one line."""
    assert sliding_windows(_target("qwen2").config) is None
    assert sliding_windows(_target("mistral").config) == WINDOW
    assert sliding_windows(_target("gemma2").config) == {"full_attention": None, "sliding_attention": WINDOW}
    assert sliding_windows(tf.Qwen2Config(use_sliding_window=False, sliding_window=4096)) is None
    for chunked in (tf.Llama4TextConfig(num_hidden_layers=2, layer_types=["chunked_attention"] * 2),
                    tf.LlamaConfig(attention_chunk_size=8)):  # fmt: skip
        with pytest.raises(AccheadError, match="not supported in a batch"):
            sliding_windows(chunked)


def test_window_mask_follows_each_rows_positions_through_holes():
    """Brute force: query (b, i) sees valid slot t iff the slot's position k (its count of valid slots
    before it) has k <= q and q - k < window; a full layer drops the window; holes are never seen."""
    g = torch.Generator().manual_seed(0)
    valid = torch.rand(3, 40, generator=g) < 0.6
    valid[:, -4:] = torch.tensor([False, True, True, True])  # the block: one hole, then 3 real tokens
    queries = valid.long().cumsum(1)[:, -4:] - 1  # (3, 4): the block's positions (the hole's: any)
    masks = window_mask({"full_attention": None, "sliding_attention": 5}, valid, queries, torch.float32)
    for kind, window in (("full_attention", None), ("sliding_attention", 5)):
        mask = masks[kind]
        assert mask.shape == (3, 1, 4, 40)
        for b in range(3):
            pos = valid[b].long().cumsum(0) - 1
            for i in range(4):
                q = int(queries[b, i])
                for t in range(40):
                    k = int(pos[t])
                    seen = bool(valid[b, t]) and k <= q and (window is None or q - k < window)
                    assert (mask[b, 0, i, t] == 0) == seen, (kind, b, i, t)
    assert window_mask(7, valid, queries, torch.bfloat16).dtype == torch.bfloat16


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mistral", "gemma2"])
def test_compiled_sliding_window_pairs_equal_the_targets_greedy(name):
    """The same past the window with every unit compiled (Inductor on the CPU): one prompt, then a batch."""
    target = _target(name)
    draft = _perturbed(target, 0.1, seed=2)
    target.generation_config.eos_token_id = draft.generation_config.eos_token_id = None
    want = [_greedy(target, p, NEW) for p in PROMPTS]
    one = SpeculativeDecoder(target, draft, policy="specdecpp:h=0.5,max=4", head=_head(draft), fast=True)
    res = one.generate(torch.tensor(PROMPTS[0]), max_new_tokens=NEW, temperature=0)
    assert res.new_ids.tolist() == want[0]
    batch = BatchedDecoder(target, draft, "specdecpp:h=0.5,max=4", head=_head(draft), fast=True)
    res = batch.generate([torch.tensor(p) for p in PROMPTS], max_new_tokens=NEW, temperature=0)
    assert [r.new_ids.tolist() for r in res.rows] == want


def test_the_forward_the_decoders_run_keeps_gemma_2s_soft_capped_logits():
    """Gemma 2 soft-caps its logits (cap · tanh(logits / cap)) after the head; the decoders' split forward
    (decoder stack, then the head: `acchead.lm_forward`) does too, so its logits are the model's. On a tiny
    random model the cap moves the logits by ~1e-4 only: the check's tolerance alone would not see it."""
    target = _target("gemma2")
    ids = torch.tensor([[5, 9, 17, 33]])
    with torch.inference_mode():
        want = target(input_ids=ids).logits
        hidden = target.get_decoder()(input_ids=ids).last_hidden_state
        got = head_logits(target, hidden)
        uncapped = target.get_output_embeddings()(hidden)
    assert target.config.final_logit_softcapping and splits_cleanly(target)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(uncapped, want, rtol=1e-6, atol=1e-6)


@pytest.mark.usefixtures("uncompiled_runners")
def test_gen_data_train_and_decode_run_on_a_gemma_2_pair(tiny_tokenizer, tmp_path, capsys):
    """The design card's commands on a Gemma 2 pair (sliding window, soft-capped logits) saved as
    directories: gen-data labels it, `acchead-train --w-rej 6 --depth 3` trains a head, and decode on both
    paths with that head gives the same greedy text and counts (the fast path's runners uncompiled)."""
    import json

    from acchead.data_gen import cli as gen_cli
    from acchead.inference.cli_decode import main as decode_main
    from acchead.train import cli as train_cli

    target = _target("gemma2")
    target.resize_token_embeddings(len(tiny_tokenizer))
    pair = {"target": target, "draft": _perturbed(target, 0.1, seed=2)}
    for name, model in pair.items():
        model.save_pretrained(tmp_path / name)
        tiny_tokenizer.save_pretrained(tmp_path / name)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"def f{i}(x):"}) + "\n" for i in range(6)))
    models = ["--target", str(tmp_path / "target"), "--draft", str(tmp_path / "draft")]
    assert gen_cli.main([*models, "--prompts", str(prompts), "--max-new-tokens", "24",
                         "--out", str(tmp_path / "data")]) == 0  # fmt: skip
    assert train_cli.main(["--data", str(tmp_path / "data"), "--w-rej", "6", "--depth", "3", "--epochs", "2",
                           "--out", str(tmp_path / "head")]) == 0  # fmt: skip
    capsys.readouterr()
    args = [*models, "--head", str(tmp_path / "head" / "head.safetensors"), "--prompt", "def g(x):",
            "--max-new-tokens", "40", "--temperature", "0", "--json"]  # fmt: skip
    runs = []
    for path in ("--no-fast", "--fast"):
        assert decode_main([*args, path]) == 0
        runs.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    assert runs[0]["text"] == runs[1]["text"] and runs[0]["target_calls"] == runs[1]["target_calls"]
    assert runs[0]["policy"].startswith("specdecpp")


def test_layers_that_differ_in_more_than_weights_are_not_compiled_as_one_region():
    """Regional compilation traces one layer and reuses it for the others, which is right only where they
    differ in their weights alone: Gemma 2's alternating sliding and full layers and SmolLM3's layers with
    and without rotary positions are compiled whole (Gemma 2's logits were 0.2-0.7 off as regions; dynamo
    happened to tell SmolLM3's apart); a Gemma 2 of one kind and Mistral as regions."""
    from acchead.inference.compile_regions import decoder_layers

    config_class, model_class, sizes = ARCHS["gemma2"]
    one_kind = model_class(config_class(vocab_size=VOCAB, layer_types=["sliding_attention"] * 2, **sizes))
    assert decoder_layers(_target("gemma2"), 0) is None and decoder_layers(_target("smollm3"), 0) is None
    assert decoder_layers(one_kind, 0) is not None and decoder_layers(_target("mistral"), 0) is not None


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gemma2", "smollm3"])
def test_a_regional_runner_gives_its_eager_logits(name):
    """The runner asked for regions (as a model of wide layers gets them) on Gemma 2 and SmolLM3, past the
    window and through rollbacks: every step's logits are the uncompiled static cache's."""
    from acchead.inference.device_path import DevicePath
    from acchead.inference.static_runner import StaticRunner

    target = _target(name)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(1, VOCAB, (20,), generator=g)
    steps = [torch.randint(1, VOCAB, (w,), generator=g) for w in (1, 3, 1, 3, 1)]

    def feeds(runner: StaticRunner) -> list[torch.Tensor]:
        out = []
        with torch.inference_mode():
            runner.reset(64)
            runner.feed(prompt)
            for tokens in steps:
                out.append(runner.feed(tokens, keep=len(tokens))[0].clone())
                if len(tokens) == 3:
                    runner.rollback(runner.length - 2)  # two of them rejected
        return out

    got = feeds(StaticRunner(target, capacity=64, device_path=DevicePath(False, regional=True)))
    want = feeds(StaticRunner(target, capacity=64, compile=False))
    for g_, w_ in zip(got, want, strict=True):
        torch.testing.assert_close(g_, w_, rtol=1e-5, atol=1e-5)
