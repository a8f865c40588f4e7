"""The frozen draft for on-the-fly features, held so that it is neither trained, checkpointed nor synced.

`FrozenDraft` is deliberately NOT an `nn.Module`: assigned as an attribute of the LightningModule it is not
registered as a submodule, so it is absent from `state_dict()` (checkpoints stay head-sized), from
`parameters()` (the optimiser never sees it) and from what DDP wraps (no gradient all-reduce for it).
Its parameters additionally have `requires_grad=False` and it runs under `torch.no_grad()`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from acchead.models import final_hidden, load_causal_lm, model_identity


class FrozenDraft:
    """A causal LM used only as a feature extractor: (B, T) token ids -> (B, T, H) final hidden states."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model.eval().requires_grad_(False)
        self.identity: dict[str, Any] = model_identity(model)

    @classmethod
    def load(cls, path: str | Path, dtype: str = "float32") -> FrozenDraft:
        return cls(load_causal_lm(path, dtype=dtype))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def to(self, device: torch.device | str) -> FrozenDraft:
        """Follow the head onto its device (Lightning moves only registered submodules)."""
        self.model.to(device)
        return self

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """input_ids, attention_mask: (B, T), right-padded -> (B, T, H) final hidden (what the LM head reads).

        Right padding leaves every real position's causal context unchanged, so the states equal those of
        one forward per row (the cache's definition).
        """
        # The base model (no LM head): the features are the hidden states, and skipping the vocab-sized
        # projection matters for small drafts with large vocabularies.
        out = self.model.base_model(
            input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, use_cache=False
        )
        return final_hidden(out)
