"""The typed decoding configuration: every registered policy's spec round-trips through its string form,
malformed specs are one-line errors, and a `DecodingSpec` builds the decoder it describes."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np
import pytest
import torch

from acchead.errors import AccheadError
from acchead.inference.bandit_spec import ArmSpec, BanditSpec, EXP3BanditSpec, UCBBanditSpec
from acchead.inference.decoder import SpeculativeDecoder
from acchead.inference.decoder_factory import build_decoder
from acchead.inference.drafter_spec import CascadeSpec, MaGSpec
from acchead.inference.policy_build import parse_policy
from acchead.inference.policy_spec import (
    ADAEDL_GAMMA,
    AdaEDLSpec,
    AutoregressiveSpec,
    ConfidenceSpec,
    EntropySpec,
    OracleSpec,
    PolicySpec,
    SpecDecPPSpec,
    SpecDecSpec,
    format_number,
)
from acchead.inference.spec import POLICY_SPECS, DecodingSpec, needs_head, parse_policy_spec

# Specs of every registered policy, each with and without its optional parameters.
SPECS = [
    "autoregressive",
    "specdec:k=4",
    "specdecpp",
    "specdecpp:h=0.7",
    "specdecpp:h=0.8,max=20,free=1",
    "specdecpp:h=0.3,free=0",
    "confidence:tau=0.4",
    "confidence:tau=0.4,max=8",
    "entropy:tau=1",
    "entropy:tau=0.25,max=6",
    "adaedl:lam=0.5",
    "adaedl:gamma=0.2,lam=0.5,adapt=1,max=20",
    "adaedl:lam=0,adapt=0",
    "oracle",
    "oracle:max=8",
    "ucb:arms=specdec:k=2|specdec:k=4",
    "ucb:delta=0.25,reward=rate,carry=1,arms=specdec:k=2|specdecpp:h=0.5,max=8|autoregressive",
    "exp3:seed=3,arms=specdec:k=1|mag:block=6@specdec:k=6|cascade:k=4.2/10@specdec:k=6",
]


def test_every_registered_policy_is_covered():
    assert {parse_policy_spec(s).name for s in SPECS} == set(POLICY_SPECS)


@pytest.mark.parametrize("text", SPECS)
def test_round_trip(text):
    spec = parse_policy_spec(text)
    assert spec.to_spec() == text == str(spec)  # the canonical form writes what was given, in field order
    assert parse_policy_spec(spec.to_spec()) == spec
    assert dataclasses.is_dataclass(spec) and hash(spec) == hash(parse_policy_spec(text))  # frozen
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "other"  # type: ignore[misc]


def test_parsing_is_lenient_about_spacing_and_case_and_typed():
    assert parse_policy_spec(" SpecDec : k = 2 ") == SpecDecSpec(k=2)
    assert parse_policy_spec("adaedl:lam=0.5,adapt=false") == AdaEDLSpec(lam=0.5, adapt=False)
    assert parse_policy_spec("oracle") == OracleSpec() and OracleSpec().max_cap == 64
    bandit = parse_policy_spec("ucb:arms=specdec:k=2|mag@specdec:k=8")
    assert isinstance(bandit, UCBBanditSpec) and bandit.arms == (
        ArmSpec(SpecDecSpec(k=2)), ArmSpec(SpecDecSpec(k=8), MaGSpec()))  # fmt: skip
    assert bandit.has_drafters and bandit.max_cap == 8


def test_numbers_are_written_exactly():
    assert format_number(0.8) == "0.8" and format_number(4.0) == "4" and format_number(True) == "1"
    precise = ConfidenceSpec(tau=0.123456789)
    assert precise.to_spec() == "confidence:tau=0.123456789"
    assert parse_policy_spec(precise.to_spec()) == precise


def test_needs_head_is_said_in_one_place():
    assert needs_head("specdecpp") and needs_head(SpecDecPPSpec(h=0.5))
    assert needs_head("ucb:arms=specdec:k=2|specdecpp:h=0.5")  # an arm reads the head
    without = ("specdec:k=3", "adaedl:lam=0.5", "oracle", "exp3:arms=specdec:k=2")
    assert not any(needs_head(s) for s in without)


def test_a_spec_outside_the_registry_is_not_built():
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class BeamSpec(PolicySpec):
        name: ClassVar[str] = "beam"

    with pytest.raises(AccheadError, match="cannot be built"):
        parse_policy(BeamSpec())
    with pytest.raises(AccheadError, match="unknown name 'beam'"):
        parse_policy_spec(BeamSpec().to_spec())


def test_adaedl_gamma_default_is_the_named_constant():
    from acchead.inference.adaedl import AdaEDL

    built = parse_policy(AdaEDLSpec(lam=0.5))
    assert isinstance(built, AdaEDL) and built.gamma == ADAEDL_GAMMA == 0.2
    assert built.spec == "adaedl:gamma=0.2,lam=0.5,adapt=1,max=20"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("beam:k=3", "unknown name"),
        ("specdec", "needs k"),
        ("specdec:k", "expected key=value"),
        ("specdec:k=two", "is not int"),
        ("specdec:k=0", "1 <= k <= 1024"),
        ("specdec:k=4,h=0.5", "takes k"),
        ("specdec:k=4,k=5", "given twice"),
        ("specdecpp:h=1.0", "0 < h < 1"),
        ("specdecpp:h=0.5,free=maybe", "not 0/1"),
        ("confidence:tau=1.5", "0 <= tau <= 1"),
        ("entropy:tau=inf", "finite tau"),
        ("adaedl:gamma=0,lam=0.5", "gamma > 0"),
        ("oracle:max=0", "1 <= max <= 1024"),
        ("ucb:specdec:k=2", "needs arms="),
        ("ucb:seed=1,arms=specdec:k=2", "options: delta, reward, carry"),
        ("exp3:seed=x,arms=specdec:k=2", "is not int"),
        ("ucb:arms=oracle", "cannot be a bandit arm"),
        ("ucb:delta=2,arms=specdec:k=2", "delta must lie in"),
        ("ucb:reward=speed,arms=specdec:k=2", "reward must be"),
        ("ucb:arms=specdec:k=0", "1 <= k <= 1024"),
    ],
)
def test_bad_specs_are_one_line_errors(text, message):
    with pytest.raises(AccheadError, match=message) as e:
        parse_policy_spec(text)
    assert "\n" not in str(e.value)


def test_decoding_spec_string_form_and_fields():
    import acchead.inference as inference

    assert inference.DecodingSpec is DecodingSpec and inference.build_decoder is build_decoder  # public API
    spec = DecodingSpec.from_spec("cascade:k=4.2/10+specdec:k=6", verifier="block", path="eager")
    assert spec.drafter == CascadeSpec(k=((4, 2), (10,))) and spec.policy == SpecDecSpec(k=6)
    with pytest.raises(AccheadError, match="unknown drafter"):  # a bad drafter fails at parse time
        DecodingSpec.from_spec("bogus:zz=1+specdec:k=4")
    assert spec.to_spec() == "cascade:k=4.2/10+specdec:k=6" and str(spec) == spec.to_spec()
    assert DecodingSpec.from_spec(spec.to_spec(), verifier="block", path="eager") == spec
    assert spec.fast is False and DecodingSpec(AutoregressiveSpec()).fast is None
    assert DecodingSpec.from_spec("specdecpp:h=0.5", head="h.safetensors").needs_head
    for kwargs, message in (({"verifier": "beam"}, "verifier must be"), ({"path": "slow"}, "path must be")):
        with pytest.raises(AccheadError, match=message):
            DecodingSpec.from_spec("specdec:k=2", **kwargs)
    with pytest.raises(AccheadError, match="needs a drafter"):
        DecodingSpec.from_spec("+specdec:k=2")
    with pytest.raises(AccheadError, match="takes no DRAFTER"):
        DecodingSpec.from_spec("mag+ucb:arms=mag@specdec:k=2")


def test_build_decoder_builds_what_the_spec_says(tiny_llama_pair):
    """Each kind of spec (a draft-model policy, a model-free drafter, a bandit over drafters) decodes
    greedily to the target's own output, with the verifier and path the spec names."""
    from acchead.inference.bandit_policy import BanditPolicy
    from acchead.inference.mag import build_bigram_table

    target, draft = tiny_llama_pair
    vocab = target.config.vocab_size
    bigram = build_bigram_table([np.random.default_rng(0).integers(0, vocab, 300)], vocab)
    prompt = torch.tensor([5, 17, 40, 5, 17, 40])
    ref = build_decoder(DecodingSpec(AutoregressiveSpec()), target, None).generate(prompt, 12, temperature=0)
    for text in ("specdec:k=3", "adaedl:lam=0.5", "mag+specdec:k=4",
                 "ucb:arms=specdec:k=2|mag:block=6@specdec:k=6"):  # fmt: skip
        dec = build_decoder(DecodingSpec.from_spec(text, verifier="block", path="eager"), target, draft,
                            bigram=bigram)  # fmt: skip
        assert dec.verifier == "block" and not dec.fast
        assert dec.generate(prompt, 12, temperature=0).new_ids.tolist() == ref.new_ids.tolist()
    assert isinstance(dec.policy, BanditPolicy) and dec.policy.spec == "ucb:delta=0.5,arms=specdec:k=2|" \
        "mag:block=6@specdec:k=6"  # fmt: skip
    with pytest.raises(AccheadError, match="needs an acceptance head"):
        build_decoder(DecodingSpec(SpecDecPPSpec(h=0.5)), target, draft)  # the decoder never picks a head


def test_built_policies_are_stateless_across_decodes(tiny_llama_pair):
    """Two decodes with one decoder give the same output and leave the policy object unchanged: the
    per-decode state (AdaEDL's λ, the bandit's statistics) lives in each decode's run."""
    target, draft = tiny_llama_pair
    prompt = torch.tensor([3, 7, 11, 5])
    for text in ("adaedl:lam=0.5", "ucb:arms=specdec:k=1|specdec:k=3", "exp3:arms=specdec:k=1|specdec:k=3"):
        dec = build_decoder(DecodingSpec.from_spec(text), target, draft)
        before = dict(vars(dec.policy))
        outs = [dec.generate(prompt, 16, temperature=1.0, seed=4).new_ids.tolist() for _ in range(2)]
        assert outs[0] == outs[1] and vars(dec.policy) == before
        assert isinstance(dec.policy_run.policy.config, AdaEDLSpec | BanditSpec)
    assert isinstance(parse_policy_spec("exp3:arms=specdec:k=1"), EXP3BanditSpec)
    assert isinstance(parse_policy_spec("entropy:tau=1"), EntropySpec)


def test_the_decoders_take_the_spec_alike(tiny_llama_pair):
    """`SpeculativeDecoder(spec=...)` and `BatchedDecoder(spec=...)` decode what the four separate arguments
    decode (a batched one on the spec's path); a spec beside them and a model-free drafter are refused in
    one line."""
    from acchead.inference.batched import BatchedDecoder

    target, draft = tiny_llama_pair
    prompt = torch.tensor([3, 7, 11, 5])
    spec = DecodingSpec.from_spec("specdec:k=3", verifier="block", path="eager")
    by_spec = SpeculativeDecoder(target, draft, spec=spec)
    by_args = SpeculativeDecoder(target, draft, policy="specdec:k=3", verifier="block", fast=False)
    assert (by_spec.verifier, by_spec.fast, by_spec.policy.spec) == ("block", False, "specdec:k=3")
    out = by_args.generate(prompt, 12, temperature=1.0, seed=3).new_ids.tolist()
    assert by_spec.generate(prompt, 12, temperature=1.0, seed=3).new_ids.tolist() == out
    batched = BatchedDecoder(target, draft, spec=spec)
    assert batched.generate([prompt], 12, temperature=1.0, seed=3).rows[0].new_ids.tolist() == out
    fast = dataclasses.replace(spec, path="fast")
    assert not batched.fast and BatchedDecoder(target, draft, spec=fast, compile=False).fast
    refusals = [
        (lambda: SpeculativeDecoder(target, draft, policy="specdec:k=2", spec=spec), "either spec= or"),
        (lambda: SpeculativeDecoder(target, draft, spec="mag+specdec:k=4"), "names a drafter: decode it"),
        (lambda: SpeculativeDecoder(target, draft, verifier="beam"), "verifier must be"),
    ]
    for make, message in refusals:
        with pytest.raises(AccheadError, match=message) as e:
            make()
        assert "\n" not in str(e.value)
