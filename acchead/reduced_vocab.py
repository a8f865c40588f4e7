"""A Llama draft whose head covers a reduced vocabulary but that reads and speaks the target's full one.

The real pair's target (SmolLM2-135M) spends 21% of its multiply-adds in its LM head (576 x 49,152); a
draft that kept the full vocabulary would pay that before any layer. This draft's head keeps only the V_d
tokens the target writes most often (8,192 cover ~90-94% of its greedy tokens; FR-Spec, EAGLE-3).

- Inputs are any of the target's tokens: the input embedding is the target's own (V x H), read from the
  target's weights when the draft is loaded (`config.embedding_source`) and never saved with the draft (it
  is 28M parameters; the draft's own weights stay ~12M). A prompt's rare tokens keep their meaning.
- Logits come out over the full vocabulary (V,): the head's V_d logits at their target ids (`to_full`),
  -inf everywhere else, so q is exactly zero outside the vocabulary. Speculative sampling stays exact: the
  verifier needs only the q it sampled from, and the target verifies with its full distribution (the
  residual max(p - q, 0) puts back the mass of the tokens the draft cannot propose).

It is a drop-in `PreTrainedModel` (`ReducedVocabLlamaForCausalLM`, model type `acchead_reduced_llama`,
registered with the Auto classes on import of `acchead.models`), so every stage that takes a draft directory
takes it unchanged. `config.vocab_size` is the full V; `config.draft_vocab_size` is V_d.
`config.embedding_source` names where the embedding comes from: `asset:<name>` (an `acchead.assets` asset,
e.g. `asset:smollm2-target`) or a model directory (absolute, or relative to the draft's directory); the
loaded rows must match `config.embedding_fingerprint` (sha256 of the table), else loading fails in one line.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from acchead.errors import AccheadError


class ReducedVocabConfig(LlamaConfig):
    """A `LlamaConfig` plus the reduced head's size and where the full input embedding comes from.

    `qk_norm`: each attention RMS-normalises every head's query and key before the rotation, as Qwen 3's
    layers do (its `Qwen3Attention`), so a draft copied from a Qwen 3 target's layers computes what they do;
    default False, Llama's attention."""

    model_type = "acchead_reduced_llama"

    def __init__(
        self,
        draft_vocab_size: int = 8192,
        embedding_source: str | None = None,
        embedding_fingerprint: str | None = None,
        qk_norm: bool = False,
        **kwargs,
    ) -> None:
        kwargs["tie_word_embeddings"] = False  # the head has its own V_d rows
        super().__init__(**kwargs)
        self.draft_vocab_size = draft_vocab_size
        self.embedding_source = embedding_source
        self.embedding_fingerprint = embedding_fingerprint
        self.qk_norm = qk_norm


class ScatterHead(nn.Module):
    """Hidden states -> full-vocabulary logits: V_d rows of its own, placed at their target ids, -inf
    elsewhere."""

    def __init__(self, hidden_size: int, vocab_size: int, draft_vocab_size: int, std: float = 0.02) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(draft_vocab_size, hidden_size) * std)  # (V_d, H)
        # to_full: (V_d,) head row -> target id; to_draft: (V,) target id -> head row, or -1 outside
        self.register_buffer("to_full", torch.arange(draft_vocab_size, dtype=torch.long))
        self.register_buffer("to_draft", torch.full((vocab_size,), -1, dtype=torch.long))
        self.to_draft[:draft_vocab_size] = torch.arange(draft_vocab_size)
        self.vocab_size = vocab_size

    def set_vocabulary(self, token_ids: torch.Tensor) -> None:
        """Make the head's rows the target tokens `token_ids` ((V_d,) distinct ids), in that order."""
        v_d = self.weight.shape[0]
        if token_ids.shape != (v_d,) or token_ids.unique().numel() != v_d:
            raise ValueError(f"need {v_d} distinct token ids, got shape {tuple(token_ids.shape)}")
        self.to_full.copy_(token_ids)
        self.to_draft.fill_(-1)
        self.to_draft[token_ids] = torch.arange(v_d, device=self.to_draft.device)

    def full_weight(self) -> torch.Tensor:
        """(V, H): the head's rows at their target ids, zero elsewhere (detached)."""
        full = self.weight.new_zeros(self.vocab_size, self.weight.shape[1])
        return full.index_copy(0, self.to_full, self.weight.detach())

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # (..., H) -> (..., V_d)
        return hidden @ self.weight.T

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # (..., H) -> (..., V)
        draft_logits = self.draft_logits(hidden)
        full = draft_logits.new_full((*hidden.shape[:-1], self.vocab_size), float("-inf"))
        return full.index_copy(-1, self.to_full, draft_logits)


def embedding_fingerprint(weight: torch.Tensor) -> str:
    """sha256 (16 hex digits) of an embedding table's float32 bytes: which target's embedding it is."""
    return hashlib.sha256(weight.detach().float().cpu().numpy().tobytes()).hexdigest()[:16]


def _read_embedding(source: str, draft_dir: Path) -> torch.Tensor:
    """The `model.embed_tokens.weight` of the model directory `source` names (module docstring)."""
    from safetensors import safe_open

    if source.startswith("asset:"):
        from acchead.assets import asset_path

        directory = asset_path(source.removeprefix("asset:"))
    else:
        directory = (draft_dir / source) if not Path(source).is_absolute() else Path(source)
    files = sorted(directory.glob("*.safetensors"))
    for f in files:
        with safe_open(f, framework="pt") as st:
            if "model.embed_tokens.weight" in st.keys():  # noqa: SIM118 (safe_open has no __contains__)
                return st.get_tensor("model.embed_tokens.weight")
    raise AccheadError(f"the draft's embedding source {directory} holds no model.embed_tokens.weight")


class ReducedVocabLlamaForCausalLM(LlamaForCausalLM):
    """`LlamaForCausalLM` whose head covers V_d tokens of the target's V (module docstring)."""

    config_class = ReducedVocabConfig
    _tied_weights_keys: dict[str, str] = {}  # noqa: RUF012 (transformers reads a class attribute)
    # The input embedding is the target's: not saved, and expected missing on load (filled from the source).
    _keys_to_ignore_on_save = ["model.embed_tokens.weight"]  # noqa: RUF012
    _keys_to_ignore_on_load_missing = [r"model\.embed_tokens\.weight"]  # noqa: RUF012

    def __init__(self, config: ReducedVocabConfig) -> None:
        super().__init__(config)
        if config.qk_norm:  # Qwen 3's attention: Llama's plus per-head norms of q and k (its public class)
            from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention

            for i, layer in enumerate(self.model.layers):
                layer.self_attn = Qwen3Attention(config, i)
        self.lm_head = ScatterHead(
            config.hidden_size, config.vocab_size, config.draft_vocab_size, config.initializer_range
        )
        self.get_input_embeddings().weight.requires_grad_(False)  # the target's: never trained here

    def get_output_embeddings(self) -> ScatterHead:
        return self.lm_head

    def set_output_embeddings(self, new_embeddings: nn.Module) -> None:
        raise NotImplementedError("the reduced-vocabulary head is not replaceable")

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """The draft, then its input embedding from `config.embedding_source` (checked by fingerprint)."""
        model = super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        source = model.config.embedding_source
        if source is None:
            raise AccheadError(f"{pretrained_model_name_or_path}: the draft names no embedding_source")
        weight = _read_embedding(source, Path(pretrained_model_name_or_path))
        if (
            model.config.embedding_fingerprint
            and embedding_fingerprint(weight) != model.config.embedding_fingerprint
        ):
            raise AccheadError(
                f"the embedding in {source} is not the one this draft was trained with (fingerprint "
                f"{embedding_fingerprint(weight)}, expected {model.config.embedding_fingerprint})"
            )
        emb = model.get_input_embeddings()
        with torch.no_grad():
            emb.weight.copy_(weight.to(emb.weight.dtype))
        emb.weight.requires_grad_(False)  # loading makes new parameters: freeze again
        return model


def register_auto_classes() -> None:
    """Let `AutoConfig` / `AutoModelForCausalLM.from_pretrained` load a saved reduced-vocabulary draft."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        AutoConfig.register(ReducedVocabConfig.model_type, ReducedVocabConfig)
        AutoModelForCausalLM.register(ReducedVocabConfig, ReducedVocabLlamaForCausalLM)
    except ValueError:  # already registered (a second import path)
        pass
