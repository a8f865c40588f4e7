"""Our decoder inside transformers' `generate` (`acchead.inference.hf`): exact, with what `generate` gives.

Greedy output equals `target.generate(do_sample=False)` token for token (with EOS inside a round, stop
strings, a caller's stopping criterion, `max_length`); sampled 3-token continuations pass the chi-square
test against the target's exact distribution under S; S is read from generate's logits processors exactly;
generation config files, streamers, `return_dict_in_generate`, seeds, the refusals, the decoder cache, the
directory form (the default heads: test_hf_generate_heads.py). Built on exact_models' peaked tiny Llamas.
"""

# ruff: noqa: F811  (the fixtures imported from hf_pair are test arguments of the same names)

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch
from exact_models import _chi_square_p_value, _exact_sequences, _peaked_llama, _perturbed
from hf_pair import Record, head, pair, prompt  # noqa: F401  (pytest fixtures, used by name)
from transformers import (
    GenerationConfig,
    StoppingCriteria,
    StoppingCriteriaList,
    StopStringCriteria,
    TextStreamer,
)
from transformers.generation.utils import GenerateDecoderOnlyOutput

from acchead.errors import AccheadError
from acchead.head import AcceptanceHead
from acchead.inference import hf, hf_decoders
from acchead.inference.spec import DecodingSpec
from acchead.sampling import SamplingConfig, probs_from_logits


def _ours(target, draft, inputs, **kw):
    kw.setdefault("max_new_tokens", 24)
    kw.setdefault("do_sample", False)
    return target.generate(**inputs, draft=draft, custom_generate=hf.generate, **kw)


@pytest.mark.parametrize(
    ("policy", "verifier"),
    [("specdecpp:h=0.5,max=6", "token"), ("specdec:k=4", "block"), ("confidence:tau=0.4", "token")],
)
def test_greedy_equals_transformers_greedy(pair, head, prompt, policy, verifier):
    target, draft = pair
    ref = target.generate(**prompt, max_new_tokens=24, do_sample=False)
    out = _ours(target, draft, prompt, head=head, policy=policy, verifier=verifier)
    assert out.tolist() == ref.tolist()
    t = prompt["input_ids"].shape[1]
    by_length = _ours(target, draft, prompt, head=head, policy=policy, max_new_tokens=None, max_length=t + 9)
    assert by_length.tolist() == ref[:, : t + 9].tolist()


@pytest.mark.parametrize(
    "spec", [DecodingSpec.from_spec("specdec:k=4", verifier="block"), "confidence:tau=0.4", "autoregressive"]
)
def test_a_decoding_spec_stands_for_policy_and_verifier(pair, prompt, spec):
    """`spec=` takes the one typed configuration `acchead-decode` and the bench take (issue 34)."""
    target, draft = pair
    ref = target.generate(**prompt, max_new_tokens=24, do_sample=False)
    assert _ours(target, draft, prompt, spec=spec).tolist() == ref.tolist()


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(spec="specdec:k=2", policy="specdec:k=3"), "either spec= or policy="),
        (dict(spec="specdec:k=2", verifier="block"), "either spec= or policy="),
        (dict(spec="mag+specdec:k=4"), "names a drafter: decode it with acchead-decode or build_decoder"),
        (dict(spec=DecodingSpec.from_spec("specdec:k=2", sampling=SamplingConfig(1.0))), "differs from"),
    ],
)
def test_decoding_spec_refusals_are_one_line(tiny_llama_pair, prompt, kw, message):
    target, draft = tiny_llama_pair
    with pytest.raises(AccheadError, match=message) as e:
        target.generate(**prompt, custom_generate=hf.generate, draft=draft, max_new_tokens=4, **kw)
    assert "\n" not in str(e.value)


def test_autoregressive_needs_no_assistant(pair, prompt):
    target, _ = pair
    ref = target.generate(**prompt, max_new_tokens=12, do_sample=False)
    out = target.generate(**prompt, custom_generate=hf.generate, policy="autoregressive", max_new_tokens=12,
                          do_sample=False)  # fmt: skip
    assert out.tolist() == ref.tolist()


def _mid_round_token(res, new: list[int]) -> int:
    """A token that first occurs as an accepted candidate followed by another token of its round."""
    start = 0
    for tau in res.accepted_per_round:
        for j in range(start, start + tau):  # candidates start..start+tau-1; the round ends at start+tau
            if new[j] not in new[:j]:
                return j
        start += tau + 1
    raise AssertionError("no round accepted a candidate: the pair no longer tests EOS inside a round")


def test_eos_inside_a_round_and_every_eos_id(pair, head, prompt):
    target, draft = pair
    t = prompt["input_ids"].shape[1]
    full = _ours(target, draft, prompt, head=head, policy="specdec:k=4", return_dict_in_generate=True)
    new = full.sequences[0, t:].tolist()
    j = _mid_round_token(full, new)
    unused = next(i for i in range(320) if i not in new)
    eos = [unused, new[j]]  # a list, as generation configs may hold: the second id ends generation
    ref = target.generate(**prompt, max_new_tokens=24, do_sample=False, eos_token_id=eos)
    out = _ours(target, draft, prompt, head=head, policy="specdec:k=4", eos_token_id=eos)
    assert out.tolist() == ref.tolist() and out.shape[1] == t + j + 1


def test_stop_strings_and_a_callers_criterion(pair, head, prompt, tiny_tokenizer):
    target, draft = pair
    t = prompt["input_ids"].shape[1]
    full = target.generate(**prompt, max_new_tokens=24, do_sample=False)
    stop = tiny_tokenizer.decode(full[0, t + 7 : t + 9])
    ref = target.generate(**prompt, max_new_tokens=24, do_sample=False, stop_strings=[stop],
                          tokenizer=tiny_tokenizer)  # fmt: skip
    assert ref.shape[1] < full.shape[1]  # the stop string ended generation early
    criteria = StoppingCriteriaList([StopStringCriteria(tiny_tokenizer, [stop])])
    out = _ours(target, draft, prompt, head=head, policy="specdec:k=4", stopping_criteria=criteria)
    assert out.tolist() == ref.tolist()

    class StopAtLength(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), input_ids.shape[1] >= t + 6, dtype=torch.bool)

    out = _ours(target, draft, prompt, head=head, policy="specdec:k=4",
                stopping_criteria=StoppingCriteriaList([StopAtLength()]))  # fmt: skip
    assert out.tolist() == full[:, : t + 6].tolist()


@pytest.fixture(scope="module")
def peaked12():
    """test_exactness's peaked pair (12 ids), without an EOS id so that every continuation has 3 tokens."""
    target = _peaked_llama(12, seed=3)
    draft = _perturbed(target, 0.5, seed=4)
    for model in (target, draft):
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
    return target, draft


@pytest.mark.parametrize(
    ("kw", "wrong"),
    [
        (dict(temperature=1.0, top_k=50), None),
        # top-k / top-p cut real mass here: ignoring them is rejected (p < 1e-9 at this size)
        (dict(temperature=0.8, top_k=5, top_p=0.9), SamplingConfig(0.8)),
    ],
    ids=["t1-k50", "t0.8-k5-p0.9"],
)
def test_sampled_continuations_follow_the_target(peaked12, kw, wrong):
    target, draft = peaked12
    head = AcceptanceHead(draft.config.hidden_size, depth=1)
    ids, n = torch.tensor([[1, 4]]), 250
    counts = Counter(
        tuple(target.generate(ids, draft=draft, custom_generate=hf.generate, head=head,
                              policy="specdecpp:h=0.5,max=3", max_new_tokens=3, do_sample=True, seed=s,
                              **kw)[0, 2:].tolist())
        for s in range(n)
    )  # fmt: skip
    cfg = SamplingConfig(kw["temperature"], kw["top_k"], kw.get("top_p", 1.0))
    assert _chi_square_p_value(counts, _exact_sequences(target, [1, 4], 3, cfg), n) > 1e-3
    if wrong is not None:
        assert _chi_square_p_value(counts, _exact_sequences(target, [1, 4], 3, wrong), n) < 1e-3


@pytest.mark.parametrize(
    "kw",
    [dict(do_sample=True, temperature=0.7, top_k=50, top_p=0.9), dict(do_sample=True, top_p=0.5),
     dict(do_sample=True, temperature=1.3, top_k=0), dict(do_sample=False, temperature=0.7)],
)  # fmt: skip
def test_s_reproduces_generates_processors(tiny_llama_pair, kw):
    """S read from the processors generate built gives the distribution those processors give."""
    target, _ = tiny_llama_pair
    seen = {}

    def capture(model, input_ids, logits_processor, stopping_criteria, generation_config, **model_kwargs):
        seen.update(processors=logits_processor, config=generation_config)
        return input_ids

    ids = torch.tensor([[3, 7, 11]])
    target.generate(ids, custom_generate=capture, max_new_tokens=4, **kw)
    s = hf.sampling_from(seen["processors"], seen["config"])
    logits = 3 * torch.randn(5, target.config.vocab_size, generator=torch.Generator().manual_seed(0))
    if kw["do_sample"]:
        theirs = seen["processors"](ids.expand(5, -1), logits.clone()).softmax(-1)
        assert s.top_k == kw.get("top_k", 50)  # transformers' default top-k applies when sampling
    else:
        theirs = torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
        assert s.greedy
    assert torch.allclose(probs_from_logits(logits, s), theirs, atol=1e-6)


def test_generation_config_files(pair, head, prompt, tmp_path):
    """A GenerationConfig saved to and loaded from a file decodes as generate decodes with it."""
    target, draft = pair
    t = prompt["input_ids"].shape[1]
    new = target.generate(**prompt, max_new_tokens=24, do_sample=False)[0, t:].tolist()
    GenerationConfig(max_new_tokens=20, do_sample=False, eos_token_id=[new[12]]).save_pretrained(tmp_path)
    config = GenerationConfig.from_pretrained(tmp_path)
    ref = target.generate(**prompt, generation_config=config)
    out = target.generate(**prompt, generation_config=config, draft=draft,
                          custom_generate=hf.generate, head=head, policy="specdecpp:h=0.5,max=6")  # fmt: skip
    assert out.tolist() == ref.tolist() and ref.shape[1] == t + new.index(new[12]) + 1
    sampled = GenerationConfig(do_sample=True, temperature=0.7, top_k=40, top_p=0.9)
    seen = {}

    def capture(model, input_ids, logits_processor, stopping_criteria, generation_config, **model_kwargs):
        seen.update(s=hf.sampling_from(logits_processor, generation_config))
        return input_ids

    target.generate(**prompt, generation_config=sampled, custom_generate=capture, max_new_tokens=4)
    assert seen["s"] == SamplingConfig(0.7, 40, 0.9)


def test_seed_defaults_to_torchs_global_generator(tiny_llama_pair, prompt):
    target, draft = tiny_llama_pair
    runs = []
    for s in (0, 0, 1):
        torch.manual_seed(s)
        runs.append(
            _ours(target, draft, prompt, policy="specdec:k=3", do_sample=True, temperature=1.0).tolist()
        )
    assert runs[0] == runs[1] != runs[2]
    state = torch.get_rng_state()
    _ours(target, draft, prompt, policy="specdec:k=3")  # greedy: the global generator is left alone
    assert torch.equal(torch.get_rng_state(), state)
    explicit = _ours(target, draft, prompt, policy="specdec:k=3", do_sample=True, temperature=1.0, seed=7)
    assert explicit.tolist() == _ours(target, draft, prompt, policy="specdec:k=3", do_sample=True, seed=7,
                                      temperature=1.0).tolist()  # fmt: skip


def test_streamers(pair, head, prompt, tiny_tokenizer, capsys):
    target, draft = pair

    rec = Record()
    out = _ours(target, draft, prompt, head=head, policy="specdec:k=4", stream_to=rec)
    t = prompt["input_ids"].shape[1]
    assert rec.puts[0] == prompt["input_ids"][0].tolist() and rec.ends == 1  # the prompt once
    assert [x for chunk in rec.puts[1:] for x in chunk] == out[0, t:].tolist()
    assert len(rec.puts) - 1 < out.shape[1] - t  # one put per round, rounds of several tokens

    target.generate(**prompt, max_new_tokens=24, do_sample=False, streamer=TextStreamer(tiny_tokenizer))
    theirs = capsys.readouterr().out
    _ours(target, draft, prompt, head=head, policy="specdec:k=4", stream_to=TextStreamer(tiny_tokenizer))
    assert capsys.readouterr().out == theirs


def test_return_dict_carries_the_round_statistics(pair, head, prompt):
    target, draft = pair
    ref = target.generate(**prompt, max_new_tokens=24, do_sample=False, return_dict_in_generate=True)
    out = _ours(
        target, draft, prompt, head=head, policy="specdecpp:h=0.5,max=6", return_dict_in_generate=True
    )
    assert isinstance(out, GenerateDecoderOnlyOutput) and isinstance(out, hf.SpeculativeGenerateOutput)
    assert out.sequences.tolist() == ref.sequences.tolist() and out[0] is out.sequences
    assert out.target_calls == out.rounds == len(out.accepted_per_round) and out.draft_calls > 0
    assert out.drafted - out.discarded == sum(out.accepted_per_round) and out.head_calls > 0
    assert out.sequences.shape[1] - prompt["input_ids"].shape[1] == out.rounds + sum(out.accepted_per_round)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(repetition_penalty=1.2), "cannot apply exactly: RepetitionPenaltyLogitsProcessor"),
        (dict(no_repeat_ngram_size=2), "cannot apply exactly: NoRepeatNGramLogitsProcessor"),
        (dict(min_new_tokens=3), "cannot apply exactly: .*MinNewTokensLengthLogitsProcessor"),
        (dict(do_sample=True, min_p=0.1), "cannot apply exactly: MinPLogitsWarper"),
        (dict(output_scores=True, return_dict_in_generate=True), "output_scores: the decoder computes no"),
        (dict(num_beams=2), "not beam search"),
        (
            dict(num_return_sequences=2, do_sample=True, draft=None, policy="autoregressive"),
            "one sequence per call",
        ),
        (dict(draft=None), "needs a draft: pass draft=DRAFT to generate"),
        (dict(policy="specdec:k=0"), "specdec needs 1 <= k <= 1024"),
    ],
)
def test_refusals_are_one_line(tiny_llama_pair, prompt, kw, message):
    target, draft = tiny_llama_pair
    kw = {"draft": draft, "policy": "specdec:k=2", **kw}
    with pytest.raises(AccheadError, match=message) as e:
        target.generate(**prompt, custom_generate=hf.generate, max_new_tokens=4, **kw)
    assert "\n" not in str(e.value)


def test_one_decoder_per_arguments(tiny_llama_pair, prompt):
    target, draft = tiny_llama_pair
    for policy in ("specdec:k=2", "specdec:k=2", "specdec:k=3"):
        _ours(target, draft, prompt, policy=policy, max_new_tokens=4)
    try:
        decoders = hf_decoders.DECODERS.decoders(target)  # owned there: nothing is stored on the model
        assert sorted(d.policy.spec for d in decoders) == ["specdec:k=2", "specdec:k=3"]
        assert not [k for k in vars(target) if "acchead" in k]
    finally:
        hf_decoders.DECODERS.release(target)


def test_no_frame_reading():
    """What the loop needs comes through generate's documented hand-over, never the caller's frame."""
    source = Path(hf.__file__).read_text()
    assert "_getframe" not in source and "f_locals" not in source
