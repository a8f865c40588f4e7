"""A Llama draft over a reduced vocabulary that still speaks the target's full one (FR-Spec, EAGLE-3).

The real pair's target (SmolLM2-135M) spends 21% of its multiply-adds in its LM head (576 x 49,152); a
draft that kept the full vocabulary would pay that before any layer. This draft keeps only the `V_d` tokens
the target writes most often (8,192 cover ~90-94% of its greedy tokens), with one table that is both its
input embedding and, tied, its output head: (V_d + 1) x H, the extra row standing for every other token.

It is a drop-in `PreTrainedModel` (`ReducedVocabLlamaForCausalLM`, model type `acchead_reduced_llama`,
registered with the Auto classes on import of `acchead.models`), so every stage that takes a draft
directory takes it unchanged:
- inputs are the target's token ids: the embedding maps them to draft rows (`to_draft`, a (V,) buffer;
  tokens outside the vocabulary share the "other" row);
- logits come out over the target's full vocabulary (V,): the V_d draft logits at their target ids
  (`to_full`), -inf everywhere else, so the draft's q is exactly zero outside its vocabulary. Speculative
  sampling stays exact: the verifier needs only the q it sampled from, and the target verifies with its
  full distribution (the residual max(p - q, 0) puts back the mass of the tokens the draft cannot propose).
- `config.vocab_size` is the full V (what the tokenizer and the target use); `config.draft_vocab_size`
  is V_d. The head has no weight of its own (it reads the embedding's rows), so nothing is tied by
  transformers' mechanism and `tie_word_embeddings` is False.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM


class ReducedVocabConfig(LlamaConfig):
    """A `LlamaConfig` plus `draft_vocab_size` (V_d); `vocab_size` stays the target's full V."""

    model_type = "acchead_reduced_llama"

    def __init__(self, draft_vocab_size: int = 8192, **kwargs) -> None:
        kwargs["tie_word_embeddings"] = (
            False  # the head reads the embedding itself (see the module docstring)
        )
        super().__init__(**kwargs)
        self.draft_vocab_size = draft_vocab_size


class VocabMappedEmbedding(nn.Module):
    """Full-vocabulary ids -> embeddings of the draft's rows; row V_d stands for every other token."""

    def __init__(self, vocab_size: int, draft_vocab_size: int, hidden_size: int, std: float = 0.02) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(draft_vocab_size + 1, hidden_size) * std)  # (V_d + 1, H)
        # to_draft: (V,) target id -> draft row; to_full: (V_d,) draft row -> target id. Identity prefix
        # until `set_vocabulary` is called.
        self.register_buffer("to_draft", torch.full((vocab_size,), draft_vocab_size, dtype=torch.long))
        self.register_buffer("to_full", torch.arange(draft_vocab_size, dtype=torch.long))
        self.to_draft[:draft_vocab_size] = torch.arange(draft_vocab_size)

    def set_vocabulary(self, token_ids: torch.Tensor) -> None:
        """Make the draft's rows the target tokens `token_ids` ((V_d,) distinct ids), in that order."""
        v_d = self.weight.shape[0] - 1
        if token_ids.shape != (v_d,) or token_ids.unique().numel() != v_d:
            raise ValueError(f"need {v_d} distinct token ids, got shape {tuple(token_ids.shape)}")
        self.to_full.copy_(token_ids)
        self.to_draft.fill_(v_d)
        self.to_draft[token_ids] = torch.arange(v_d, device=self.to_draft.device)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # (..., ) -> (..., H)
        return nn.functional.embedding(self.to_draft[input_ids], self.weight)


class ScatterHead(nn.Module):
    """Hidden states -> full-vocabulary logits: the embedding's V_d rows as the head, -inf elsewhere.

    Holds its embedding by a plain reference (not a submodule), so the table is one parameter with one
    name in the state dict."""

    def __init__(self, embedding: VocabMappedEmbedding, vocab_size: int) -> None:
        super().__init__()
        self.__dict__["embedding"] = embedding  # not registered: no second name for the same weight
        self.vocab_size = vocab_size

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # (..., H) -> (..., V)
        emb = self.embedding
        draft_logits = hidden @ emb.weight[:-1].T  # (..., V_d)
        full = draft_logits.new_full((*hidden.shape[:-1], self.vocab_size), float("-inf"))
        return full.index_copy(-1, emb.to_full, draft_logits)

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (..., V_d + 1): the logits over the draft's rows, "other" included (for training)."""
        return hidden @ self.embedding.weight.T


class ReducedVocabLlamaForCausalLM(LlamaForCausalLM):
    """`LlamaForCausalLM` whose embedding and head cover V_d tokens of the target's V (module docstring)."""

    config_class = ReducedVocabConfig
    _tied_weights_keys: dict[str, str] = {}  # noqa: RUF012 (transformers reads a class attribute)

    def __init__(self, config: ReducedVocabConfig) -> None:
        super().__init__(config)
        self.model.embed_tokens = VocabMappedEmbedding(
            config.vocab_size, config.draft_vocab_size, config.hidden_size, config.initializer_range
        )
        self.lm_head = ScatterHead(self.model.embed_tokens, config.vocab_size)

    def get_output_embeddings(self) -> ScatterHead:
        return self.lm_head

    def set_output_embeddings(self, new_embeddings: nn.Module) -> None:
        raise NotImplementedError("the reduced-vocabulary head reads the input embedding; it is not settable")


def register_auto_classes() -> None:
    """Let `AutoConfig` / `AutoModelForCausalLM.from_pretrained` load a saved reduced-vocabulary draft."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        AutoConfig.register(ReducedVocabConfig.model_type, ReducedVocabConfig)
        AutoModelForCausalLM.register(ReducedVocabConfig, ReducedVocabLlamaForCausalLM)
    except ValueError:  # already registered (a second import path)
        pass
