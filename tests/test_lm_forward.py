"""acchead.lm_forward: the decoder stack + LM head the decoders run, against the model's own forward."""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_llama
from transformers import DynamicCache, LlamaForCausalLM

from acchead.lm_forward import head_logits, lm_forward
from acchead.models import CACHE_ARG


@pytest.fixture
def llama():
    return make_tiny_llama(96, hidden_size=32, num_layers=2, seed=3)


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 7])
def test_head_logits_is_the_head(llama, rows):
    """The W·hᵀ form (CPU, float32, bias-free Linear) gives the head's own product, for any row count."""
    hidden = torch.randn(1, rows, 32)
    torch.testing.assert_close(head_logits(llama, hidden), llama.get_output_embeddings()(hidden))
    assert head_logits(llama, hidden).shape == (1, rows, 96)


@torch.inference_mode()
def test_lm_forward_equals_the_models_forward_with_a_cache(llama):
    """Prefill, then 1- and 3-token feeds over the same cache: the model's logits and final hidden states
    (`output_hidden_states`), position for position."""
    ours, theirs = DynamicCache(), DynamicCache()
    for ids, keep in [([[5, 7, 11, 13]], 4), ([[17]], 1), ([[19, 23, 29]], 2)]:
        ids = torch.tensor(ids)
        logits, hidden = lm_forward(llama, ids, keep, True, **{CACHE_ARG: ours}, use_cache=True)
        out = llama(input_ids=ids, **{CACHE_ARG: theirs}, use_cache=True, output_hidden_states=True)
        torch.testing.assert_close(logits, out.logits[:, -keep:], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(hidden, out.hidden_states[-1][:, -keep:], rtol=1e-5, atol=1e-5)
        assert lm_forward(llama, ids[:, -1:], 1, False, use_cache=False)[1] is None


class _ScaledLogits(LlamaForCausalLM):
    """A model whose logits are not its head's product (as with soft-capping or a logit scale)."""

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        out.logits = out.logits * 2.0
        return out


@torch.inference_mode()
def test_a_model_with_its_own_logit_transform_runs_its_own_forward(llama):
    scaled = _ScaledLogits(llama.config).eval()
    scaled.load_state_dict(llama.state_dict())
    ids = torch.tensor([[5, 7, 11]])
    logits, _ = lm_forward(scaled, ids, 2, False, use_cache=False)
    torch.testing.assert_close(logits, scaled(input_ids=ids, use_cache=False).logits[:, -2:])
