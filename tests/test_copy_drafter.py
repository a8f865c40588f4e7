"""Copy rounds (`acchead.inference.copy_drafter`): the continuation they copy, and decoding with them stays
exact (greedy-identical to the target, chi-square under sampling) beside a model draft and a feature draft."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
import torch
from exact_models import _chi_square_p_value, _exact_sequences, _peaked_llama, _perturbed

from acchead.distill.draft import init_from_target
from acchead.errors import AccheadError
from acchead.head import AcceptanceHead
from acchead.inference.cascade import make_drafter
from acchead.inference.copy_drafter import CopyDrafter
from acchead.inference.decoder import SpeculativeDecoder
from acchead.inference.decoder_factory import build_decoder
from acchead.inference.drafter_spec import CopySpec, parse_drafter_spec
from acchead.inference.spec import DecodingSpec, spec_arguments
from acchead.sampling import SamplingConfig

VOCAB = 12


@pytest.fixture(scope="module")
def pair():
    target = _peaked_llama(VOCAB, seed=3)
    return target, _perturbed(target, 0.5, seed=4)


def _feature_draft(target):
    """A feature draft started from the target's last layer, jittered so it disagrees sometimes."""
    draft = init_from_target(target, torch.arange(VOCAB), (1,), feature=True).eval()
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in draft.parameters():
            if p.requires_grad:
                p.add_(0.3 * p.std() * torch.randn(p.shape, generator=g))
    return draft


def _copy(seq: list[int], min_match: int, count: int) -> list[int]:
    from acchead.inference.copy_drafter import copy_continuation

    return copy_continuation(np.array(seq, dtype=np.int64), min_match, count)


def test_the_continuation_of_the_longest_earlier_match_periodic_past_the_end():
    # suffix [7, 8] occurs at 1..2; what followed it: 9, 5, then the sequence's own end, so period 4
    assert _copy([3, 7, 8, 9, 5, 7, 8], 2, 3) == [9, 5, 7]
    assert _copy([3, 7, 8, 9, 5, 7, 8], 2, 6) == [9, 5, 7, 8, 9, 5]
    assert _copy([3, 7, 8, 9, 5, 7, 8], 3, 6) == []  # the match is 2 long: below min_match
    assert _copy([3, 7, 8, 9, 5, 6], 1, 4) == []  # the last token occurs nowhere before
    assert _copy([4, 4, 4], 2, 3) == [4, 4, 4]  # period 1: a run continues
    # the longest match wins over a later shorter one: [1, 2, 3] at 0..2, not [2, 3] at 5..6
    assert _copy([1, 2, 3, 6, 0, 2, 3, 5, 1, 2, 3], 2, 2) == [6, 0]


def test_spec_round_trips_and_bad_specs_are_one_line_errors():
    assert parse_drafter_spec("copy") == CopySpec()
    spec = DecodingSpec.from_spec("copy:min=2,block=8+specdec:k=3")
    assert spec.drafter == CopySpec(2, 8) and spec.to_spec() == "copy:min=2,block=8+specdec:k=3"
    assert DecodingSpec.from_spec("copy:batch=32+specdec:k=3").drafter == CopySpec(batch_budget=32)
    assert CopySpec(batch_budget=8).to_spec() == "copy:batch=8" and CopySpec(2, 3).row_block(4) == 3
    assert not spec.needs_bigram and DecodingSpec.from_spec("mag+specdec:k=3").needs_bigram
    for bad in ("copy:min=0", "copy:len=3", "copy:block=x", "copy:batch=0"):
        with pytest.raises(AccheadError):
            parse_drafter_spec(bad)
    with pytest.raises(AccheadError, match="bandit arm"):
        make_drafter("copy", draft=None, bigram=[0] * VOCAB, vocab_size=VOCAB)


def test_copy_rounds_need_a_draft_model_and_no_bandit(pair):
    target, draft = pair
    with pytest.raises(AccheadError, match="pass a draft model"):
        SpeculativeDecoder(target, None, policy="autoregressive", copy=CopySpec())
    with pytest.raises(AccheadError, match="bandit"):
        SpeculativeDecoder(target, draft, policy="ucb:arms=specdec:k=1|specdec:k=2", copy=CopySpec())
    with pytest.raises(AccheadError, match="not both"):
        SpeculativeDecoder(target, draft, spec="copy+specdec:k=2", copy=CopySpec())
    assert isinstance(SpeculativeDecoder(target, draft, spec="copy:min=2+specdec:k=2").drafter, CopyDrafter)
    with pytest.raises(AccheadError, match="split_copy_rounds"):  # a caller that does not take them
        spec_arguments("copy+specdec:k=2", None, None, None, None)


def _greedy(target, prompt: list[int], n: int) -> list[int]:
    out = target.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, pad_token_id=0)
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("feature", [False, True], ids=["model-draft", "feature-draft"])
@pytest.mark.parametrize("policy", ["specdec:k=2", "specdecpp:h=0.5,max=4"])
def test_greedy_equals_the_targets_and_both_kinds_of_round_run(pair, feature, policy):
    target, draft = pair
    draft = _feature_draft(target) if feature else draft
    spec = DecodingSpec.from_spec(f"copy:min=2,block=6+{policy}", path="eager")
    if spec.needs_head:  # a random head: its stops are arbitrary, which exactness must not notice
        dec = SpeculativeDecoder(target, draft, policy=policy, head=AcceptanceHead(32, depth=1), fast=False,
                                 copy=spec.drafter)  # fmt: skip
    else:
        dec = build_decoder(spec, target, draft)
    ended = []
    dec.policy.end_round = lambda run, drafted, accepted: ended.append(drafted)  # counts the policy's rounds
    prompt = [1, 4, 2, 1, 4, 2, 7, 1, 4]
    with torch.inference_mode():
        res = dec.generate(torch.tensor(prompt), max_new_tokens=40, temperature=0)
    assert res.new_ids.tolist() == _greedy(target, prompt, 40)
    copier = dec.drafter
    assert copier.copied_rounds == res.copied_rounds > 0 and res.draft_calls > 0  # both kinds of round ran
    assert len(ended) == res.rounds - copier.copied_rounds  # the policy saw its own rounds only
    assert sum(res.drafted_per_round) == sum(ended) + copier.copied_tokens


@pytest.mark.parametrize("feature", [False, True], ids=["model-draft", "feature-draft"])
@pytest.mark.parametrize(("policy", "verifier"), [("specdec:k=2", "token"), ("specdec:k=3", "block")])
def test_sampling_stays_exact(pair, feature, policy, verifier):
    """3-token continuations of a prompt whose suffix recurs (its first round is a copy round) follow the
    target's exact distribution, as do their first one and two tokens (a q that is not the copy's one-hot
    law fails the first token's test)."""
    target, draft = pair
    draft = _feature_draft(target) if feature else draft
    dec = SpeculativeDecoder(target, draft, policy=policy, verifier=verifier, fast=False, copy=CopySpec(2, 4))
    cfg, prompt, n = SamplingConfig(1.0), [1, 4, 2, 1, 4], 250
    counts, copied = Counter(), 0
    with torch.inference_mode():
        for s in range(n):
            counts[tuple(dec.generate(torch.tensor(prompt), max_new_tokens=3, temperature=1.0,
                                      seed=s).new_ids.tolist())] += 1  # fmt: skip
            copied += dec.drafter.copied_rounds
    assert copied >= n  # every decode's first round copies [2, 1, 4, ...]
    assert _chi_square_p_value(counts, _exact_sequences(target, prompt, 3, cfg), n) > 1e-3


@pytest.mark.parametrize("feature", [False, True], ids=["model-draft", "feature-draft"])
def test_fast_path_copy_rounds_are_the_eager_paths(pair, feature):
    """On the fast path's static caches (uncompiled: the functions the compiled units trace), copy rounds
    give the eager path's tokens and rounds, greedy and sampled, with either kind of draft."""
    target, draft = pair
    draft = _feature_draft(target) if feature else draft
    fast, eager = (SpeculativeDecoder(target, draft, policy="specdec:k=2", fast=f, compile=False,
                                      copy=CopySpec(2, 6)) for f in (True, False))  # fmt: skip
    prompt = torch.tensor([1, 4, 2, 1, 4, 2, 7, 1, 4])
    with torch.inference_mode():
        for temperature, seed in ((0.0, 0), (1.0, 1), (1.0, 2)):
            a = fast.generate(prompt, max_new_tokens=32, temperature=temperature, seed=seed)
            b = eager.generate(prompt, max_new_tokens=32, temperature=temperature, seed=seed)
            assert a.new_ids.tolist() == b.new_ids.tolist() and a.drafted_per_round == b.drafted_per_round
            assert fast.drafter.copied_rounds == eager.drafter.copied_rounds > 0 and a.draft_calls > 0


@pytest.mark.parametrize("feature", [False, True], ids=["model-draft", "feature-draft"])
def test_compiled_copy_rounds_compile_nothing_after_warm_up(pair, caplog, feature):
    """Compiled (the device path's units through the `cudagraphs` backend, uncaptured on the CPU: seconds of
    tracing): `warm_up` prepares the widths a copy round verifies, and the draft's catch-up after copy
    rounds (a feature draft: up to a compiled width, a token-level draft: up to 2 tokens; the rest fed
    uncompiled) runs no new unit, so nothing compiles during the decode; greedy tokens are the target's."""
    import logging

    from acchead.inference.device_path import DevicePath

    target, draft = pair
    draft = _feature_draft(target) if feature else draft
    dec = SpeculativeDecoder(target, draft, policy="specdec:k=2", fast=True, copy=CopySpec(2, 6),
                             device_path=DevicePath(True, backend="cudagraphs"))  # fmt: skip
    prompt = [8, 5, 8, 3, 9, 8]
    dec.warm_up(len(prompt) + 40)
    with caplog.at_level(logging.DEBUG, logger="acchead.inference.compiled_units"), torch.inference_mode():
        res = dec.generate(torch.tensor(prompt), max_new_tokens=40, temperature=0)
    assert not [r.getMessage() for r in caplog.records if "ready in" in r.getMessage()]  # nothing compiled
    assert res.new_ids.tolist() == _greedy(target, prompt, 40)
    rounds = list(zip(res.drafted_per_round, res.accepted_per_round, strict=True))
    assert any(a == (6, 6) and b[0] == 2 for a, b in itertools.pairwise(rounds))  # a draft round after one


def test_decode_cli_takes_copy_rounds_and_counts_them(tiny_pair_dirs, capsys):
    """`acchead-decode --policy copy:...+POLICY` decodes with copy rounds and says how many rounds copied."""
    import json

    from acchead.inference.cli_decode import main as decode_main

    t, d = tiny_pair_dirs
    prompt = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return"  # its suffix recurs
    argv = ["--target", str(t), "--draft", str(d), "--prompt", prompt, "--max-new-tokens", "12",
            "--policy", "copy:min=2+specdec:k=2"]  # fmt: skip
    assert decode_main(argv) == 0
    assert "copied) | target calls" in capsys.readouterr().out
    assert decode_main([*argv, "--json"]) == 0
    stats = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert stats["copied_rounds"] >= 1 and stats["policy"].startswith("specdec:k=2")


def test_transformers_generate_takes_copy_rounds(pair):
    """`generate(..., custom_generate=hf.generate, spec="copy+POLICY")` decodes with copy rounds: the target's
    greedy tokens, and the decoder it caches copied some rounds."""
    from acchead.inference import hf
    from acchead.inference.hf_decoders import decoder_for

    target, draft = pair
    prompt = [1, 4, 2, 1, 4, 2, 7, 1, 4]
    ids = torch.tensor([prompt])
    kw = dict(max_new_tokens=24, do_sample=False, pad_token_id=0)
    with torch.inference_mode():
        out = target.generate(ids, draft=draft, custom_generate=hf.generate, spec="copy:min=2+specdec:k=2",
                              **kw)  # fmt: skip
    assert out[0, len(prompt) :].tolist() == _greedy(target, prompt, 24)
    decoder = decoder_for(target, draft, DecodingSpec.from_spec("specdec:k=2").policy, None, "token", None,
                          CopySpec(2))  # fmt: skip
    assert decoder.drafter.copied_rounds > 0
