"""acchead.models: loading errors, tokenizer matching, the dtype-invariant draft fingerprint, final_hidden."""

from __future__ import annotations

import pytest
import torch
from conftest import TOKENIZER_TEXT, make_tiny_llama, make_tiny_tokenizer

from acchead.errors import AccheadError
from acchead.models import (
    check_tokenizers_match,
    final_hidden,
    load_causal_lm,
    load_tokenizer,
    model_identity,
    parse_dtype,
)


def test_final_hidden_is_what_the_lm_head_reads(tiny_llama_pair):
    ids = torch.randint(0, 300, (2, 9), generator=torch.Generator().manual_seed(0))
    for model in tiny_llama_pair:
        with torch.no_grad():
            out = model(ids, output_hidden_states=True)
        h = final_hidden(out)
        assert h.shape == (2, 9, model.config.hidden_size)
        # Post final norm: the LM head on it reproduces the logits, so the head sees what sampling sees.
        torch.testing.assert_close(model.lm_head(h), out.logits, rtol=0, atol=1e-6)


def test_final_hidden_needs_hidden_states(tiny_llama_pair):
    with torch.no_grad():
        out = tiny_llama_pair[1](torch.tensor([[1, 2, 3]]))
    with pytest.raises(ValueError, match="output_hidden_states"):
        final_hidden(out)


def test_identity_fields(tiny_llama_pair):
    target, draft = tiny_llama_pair
    ident = model_identity(draft)
    assert set(ident) == {"name", "hidden_size", "vocab_size", "fingerprint"}
    assert (ident["hidden_size"], ident["vocab_size"]) == (32, draft.config.vocab_size)
    assert model_identity(target)["hidden_size"] == 64
    assert model_identity(target)["fingerprint"] != ident["fingerprint"]


def test_fingerprint_separates_weights_of_one_architecture(tiny_tokenizer):
    a = make_tiny_llama(len(tiny_tokenizer), 32, 2, seed=2)
    b = make_tiny_llama(len(tiny_tokenizer), 32, 2, seed=3)
    same = make_tiny_llama(len(tiny_tokenizer), 32, 2, seed=2)
    assert model_identity(a)["fingerprint"] == model_identity(same)["fingerprint"]
    assert model_identity(a)["fingerprint"] != model_identity(b)["fingerprint"]


@pytest.mark.parametrize("stored", [torch.float32, torch.float16, torch.bfloat16])
def test_fingerprint_is_invariant_to_load_dtype(tmp_path, tiny_tokenizer, stored):
    model = make_tiny_llama(len(tiny_tokenizer), 32, 2, seed=5).to(stored)
    model.save_pretrained(tmp_path / "m")
    loads = {dt: load_causal_lm(tmp_path / "m", dtype=dt) for dt in ("float32", "float16", "bfloat16")}
    fps = {dt: model_identity(m)["fingerprint"] for dt, m in loads.items()}
    assert len(set(fps.values())) == 1, fps
    assert fps["float32"] == model_identity(model)["fingerprint"]
    assert {m.dtype for m in loads.values()} == {torch.float32, torch.float16, torch.bfloat16}
    assert model_identity(loads["bfloat16"])["name"] == "m"
    if stored == torch.float32:
        # Not vacuous: the fp16 load rounds twice, so a hash of bf16-rounded values would differ here.
        w = loads["float32"].get_input_embeddings().weight
        w16 = loads["float16"].get_input_embeddings().weight
        assert not torch.equal(w.bfloat16(), w16.bfloat16())


def test_load_causal_lm_from_dir(tiny_pair_dirs):
    target_dir, _ = tiny_pair_dirs
    model = load_causal_lm(target_dir)
    assert not model.training and model.dtype == torch.float32
    assert load_causal_lm(str(target_dir), device_map="cpu").device.type == "cpu"


def _one_line_error(fn, *args, match: str, **kwargs) -> str:
    with pytest.raises(AccheadError, match=match) as e:
        fn(*args, **kwargs)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_load_errors_are_one_line(tmp_path):
    _one_line_error(load_causal_lm, tmp_path / "nope", match="does not exist")
    _one_line_error(load_causal_lm, tmp_path, match="not a Hugging Face model directory")
    (tmp_path / "file.txt").write_text("x")
    _one_line_error(load_causal_lm, tmp_path / "file.txt", match="not a directory")
    _one_line_error(load_tokenizer, tmp_path, match="not a Hugging Face tokenizer directory")
    (tmp_path / "config.json").write_text("{}")  # looks like a model directory, holds none
    _one_line_error(load_causal_lm, tmp_path, match="cannot load a causal LM")
    _one_line_error(parse_dtype, "float8", match="unknown dtype")


def test_bad_device_is_one_line(tiny_pair_dirs):
    _one_line_error(load_causal_lm, tiny_pair_dirs[1], device="gpu7", match="invalid device")
    if not torch.cuda.is_available():
        _one_line_error(load_causal_lm, tiny_pair_dirs[1], device="cuda", match="no CUDA device")


def test_tokenizers_match(tiny_pair_dirs, tiny_tokenizer):
    target_dir, draft_dir = tiny_pair_dirs
    check_tokenizers_match(load_tokenizer(target_dir), load_tokenizer(draft_dir))
    check_tokenizers_match(tiny_tokenizer, load_tokenizer(draft_dir))


def test_tokenizer_mismatch_is_detected(tiny_tokenizer):
    bigger = make_tiny_tokenizer(vocab_size=330)
    _one_line_error(check_tokenizers_match, tiny_tokenizer, bigger, match="320 tokens, draft has 330")
    # Same size, other merges: a different id -> token mapping.
    other = make_tiny_tokenizer(text=[*TOKENIZER_TEXT, "lambda zz: zz * 2  # zzz\n" * 50])
    assert len(other) == len(tiny_tokenizer)
    _one_line_error(check_tokenizers_match, tiny_tokenizer, other, match="is id .* in the target")


def test_tokenizer_eos_mismatch_is_detected(tiny_tokenizer):
    from transformers import PreTrainedTokenizerFast

    other_eos = PreTrainedTokenizerFast(tokenizer_object=tiny_tokenizer.backend_tokenizer, eos_token="a")
    assert other_eos.get_vocab() == tiny_tokenizer.get_vocab()
    _one_line_error(check_tokenizers_match, tiny_tokenizer, other_eos, match="eos id")
