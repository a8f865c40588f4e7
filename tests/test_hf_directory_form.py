"""The directory form of the `generate` integration (`custom_generate=custom_generate_dir()`,
`trust_remote_code=True`): what `generate` hands it unprepared (assistant_model, streamer, stop strings from
the call or a generation config) reaches the loop, and what it cannot honour is refused in one line; the
model inputs the decoder cannot feed are refused too (`acchead.inference.hf`)."""

# ruff: noqa: F811  (the fixtures imported from hf_pair are test arguments of the same names)

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from hf_pair import Record, head, pair, prompt  # noqa: F401  (pytest fixtures, used by name)
from transformers import DynamicCache, GenerationConfig

from acchead.cache_keyword import CACHE_ARG
from acchead.errors import AccheadError
from acchead.inference import hf
from acchead.inference.hf_arguments import check_inputs


def test_directory_form(pair, head, prompt, tiny_tokenizer, tmp_path, monkeypatch):
    """`custom_generate=custom_generate_dir(), trust_remote_code=True`, stop strings included (the
    directory form turns them into a criterion: the callable never gets the tokenizer)."""
    import transformers.dynamic_module_utils as dynamic

    # transformers copies generate.py into its modules cache and imports it from there: keep both local.
    monkeypatch.setattr(dynamic, "HF_MODULES_CACHE", str(tmp_path))
    monkeypatch.setattr(sys, "path", list(sys.path))
    target, draft = pair
    path = hf.custom_generate_dir()
    assert (Path(path) / "custom_generate" / "generate.py").is_file()
    t = prompt["input_ids"].shape[1]
    full = target.generate(**prompt, max_new_tokens=24, do_sample=False)
    rec = Record()
    out = target.generate(**prompt, assistant_model=draft, streamer=rec, custom_generate=path,
                          trust_remote_code=True, head=head, policy="specdec:k=4", max_new_tokens=24,
                          do_sample=False)  # fmt: skip
    assert out.tolist() == full.tolist()
    # generate's own assistant_model and streamer reach the loop: the prompt streamed once, then the rounds
    assert rec.puts[0] == prompt["input_ids"][0].tolist() and rec.ends == 1
    assert [x for chunk in rec.puts[1:] for x in chunk] == out[0, t:].tolist()
    stop = tiny_tokenizer.decode(full[0, t + 7 : t + 9])
    ref = target.generate(**prompt, max_new_tokens=24, do_sample=False, stop_strings=[stop],
                          tokenizer=tiny_tokenizer)  # fmt: skip
    out = target.generate(**prompt, assistant_model=draft, custom_generate=path, trust_remote_code=True,
                          head=head, policy="specdec:k=4", max_new_tokens=24, do_sample=False,
                          stop_strings=[stop], tokenizer=tiny_tokenizer)  # fmt: skip
    assert out.tolist() == ref.tolist() and ref.shape[1] < full.shape[1]


def test_stop_strings_from_a_generation_config_reach_the_loop(pair, head, prompt, tiny_tokenizer):
    """A `generation_config` carrying stop strings: the directory form takes them out of a copy (the
    caller's config is untouched) and stops where transformers' own greedy loop stops."""
    target, draft = pair
    t = prompt["input_ids"].shape[1]
    full = target.generate(**prompt, max_new_tokens=24, do_sample=False)
    stop = tiny_tokenizer.decode(full[0, t + 7 : t + 9])
    config = GenerationConfig(max_new_tokens=24, do_sample=False, stop_strings=[stop])
    ref = target.generate(**prompt, generation_config=config, tokenizer=tiny_tokenizer)
    out = hf.run_directory_form(target, prompt["input_ids"], generation_config=config,
                                tokenizer=tiny_tokenizer, attention_mask=prompt["attention_mask"],
                                assistant_model=draft, head=head, policy="specdec:k=4")  # fmt: skip
    assert out.tolist() == ref.tolist() and ref.shape[1] < full.shape[1]
    assert config.stop_strings == [stop]


def test_directory_form_refusals_are_one_line(pair, prompt, tiny_tokenizer):
    target, draft = pair
    ids, kw = prompt["input_ids"], dict(assistant_model=draft, policy="specdec:k=2", max_new_tokens=4)
    cases = [
        (dict(assistant_tokenizer=tiny_tokenizer), "assistant_tokenizer is not supported"),
        (dict(stop_strings=["x"]), "stop_strings need the tokenizer: pass tokenizer="),
    ]
    for extra, message in cases:
        with pytest.raises(AccheadError, match=message) as e:
            hf.run_directory_form(target, ids, **kw, **extra)
        assert "\n" not in str(e.value)
    target.generation_config.stop_strings = ["x"]  # generate would refill it from here on every call
    try:
        with pytest.raises(AccheadError, match="the model's generation_config sets stop_strings"):
            hf.run_directory_form(target, ids, **kw, stop_strings=["y"], tokenizer=tiny_tokenizer)
    finally:
        target.generation_config.stop_strings = None


def test_model_inputs_the_decoder_cannot_feed_are_refused(pair, prompt):
    """A cache that already holds tokens, model inputs beside input_ids, an empty prompt: one line each."""
    target, draft = pair
    kw = dict(draft=draft, custom_generate=hf.generate, policy="specdec:k=2", max_new_tokens=4)
    cache = DynamicCache()
    with torch.no_grad():
        target(prompt["input_ids"], **{CACHE_ARG: cache})
    with pytest.raises(AccheadError, match=f"{CACHE_ARG} holds tokens: the speculative decoder starts"):
        target.generate(**prompt, **{CACHE_ARG: cache}, **kw)
    with pytest.raises(AccheadError, match="inputs the speculative decoder cannot feed: labels"):
        target.generate(**prompt, labels=prompt["input_ids"], **kw)
    with pytest.raises(AccheadError, match="needs input_ids"):
        check_inputs(torch.zeros(1, 0, dtype=torch.long), {})
