"""Which head `generate(custom_generate=acchead.inference.hf.generate)` decodes with when given none: the
demo draft's shipped head for the call's S (resolved by the integration, never the decoder), one line
for a draft that ships none, and the overhead command's default head (resolved at its command line)."""

from __future__ import annotations

import pytest
import torch

from acchead.errors import AccheadError
from acchead.inference import hf, hf_decoders
from acchead.sampling import SamplingConfig


def test_demo_pair_uses_its_shipped_head():
    """generate resolves the default head (the decoder never picks one): the demo draft's shipped head for
    the call's S, looked up once per (draft, S)."""
    from acchead import demo_pair
    from acchead.models import load_causal_lm

    target, draft = load_causal_lm(str(demo_pair.TARGET_DIR)), load_causal_lm(str(demo_pair.DRAFT_DIR))
    ids = torch.tensor([[5, 17, 42, 9]])
    ref = target.generate(ids, max_new_tokens=16, do_sample=False)
    out = target.generate(ids, draft=draft, custom_generate=hf.generate, max_new_tokens=16,
                          do_sample=False, return_dict_in_generate=True)  # fmt: skip
    assert out.sequences.tolist() == ref.tolist() and out.head_calls > 0
    (decoder,) = hf_decoders.DECODERS.decoders(target)
    assert decoder.head_meta.sampling_config.greedy and decoder.policy.h == decoder.head_meta.default_h
    target.generate(ids, draft=draft, custom_generate=hf.generate, max_new_tokens=4, do_sample=True,
                    temperature=1.0, top_k=50)  # fmt: skip
    sampled = SamplingConfig(1.0, 50)
    assert hf_decoders.pair_heads(draft) == {
        SamplingConfig(0.0): demo_pair.head_for(SamplingConfig(0.0)),
        sampled: demo_pair.head_for(sampled),
    }
    assert {d.head_meta.sampling_config for d in hf_decoders.DECODERS.decoders(target)} == {
        SamplingConfig(0.0),
        sampled,
    }
    hf_decoders.DECODERS.release(target)


def test_no_head_for_another_draft_is_one_line(tiny_llama_pair):
    target, draft = tiny_llama_pair
    with pytest.raises(AccheadError, match="needs an acceptance head: pass head=") as e:
        target.generate(torch.tensor([[5, 17, 42]]), draft=draft, custom_generate=hf.generate,
                        max_new_tokens=4, do_sample=False)  # fmt: skip
    assert "\n" not in str(e.value)


def test_the_overhead_command_times_the_demo_pair_with_its_head(capsys):
    """`python -m acchead.inference.bench.hf_custom` on its defaults (the demo pair, SpecDec++ with the
    shipped head its command line resolves): both ways timed and the goal's verdict printed."""
    from acchead.inference.bench import hf_custom

    assert hf_custom.main(["--num-prompts", "1", "--max-new-tokens", "4", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "1 calls, " in out and "through generate" in out and "goal: through generate" in out
    assert hf_custom.main(["--prompts", "missing.jsonl"]) == 2  # one line, before any model loads
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.endswith("error: prompt file does not exist: missing.jsonl")
