"""A feature draft (EAGLE, Li et al. 2024): one Llama layer that reads the target's final hidden states.

An independent draft must predict the target's next token from tokens alone; a feature draft also reads
the target's final hidden state f_j at every committed position j (the vector the target's LM head reads,
so it already holds the target's own next-token prediction) and learns the step from f_j to f_{j+1}:

    x_j = fc([embed(t_{j+1}); f_j])            (H)   the next token's embedding beside the state before it
    h_j = norm(layer(x_0..x_j))                (H)   one causal Llama layer with its own KV cache
    q_j = softmax(head(h_j))                          the draft's distribution of t_{j+2}

h_j is trained to regress f_{j+1} (smooth L1) and head(h_j) to predict the target's token (cross-entropy).
While drafting, the states of candidates the target has not verified are the draft's own h: candidate k+1
reads (h of candidate k's step, candidate k). After verification the target hands back the true states of
the accepted positions (`acchead.inference.feature_drafter`), which replace the draft's guesses.

The head is a reduced-vocabulary `ScatterHead` (`acchead.reduced_vocab`): V_d rows, logits over the full
V with -inf outside, so q is exact for speculative sampling. The input embedding is the target's (frozen,
not saved, loaded from `config.embedding_source` like every reduced-vocabulary draft).

Cost per token on SmolLM2-135M (H = 576, V_d = 8,192): fc 0.66M + layer 3.54M + head 4.72M ≈ 8.9M
multiply-adds, c ≈ 0.066 of the target's 134.5M.
"""

from __future__ import annotations

import torch
from torch import nn

from acchead.feature_chain import chain_hidden_states, gather_levels, target_states
from acchead.reduced_vocab import ReducedVocabConfig, ReducedVocabLlamaForCausalLM


class FeatureDraftConfig(ReducedVocabConfig):
    """A reduced-vocabulary draft's config; `model_type` marks it as reading the target's states.

    `fused_layers`: indices of the target's decoder layers (each below its last) whose outputs the draft
    reads beside the final state, as EAGLE-3 fuses low-, mid- and high-level states (default: none). The
    states it reads are then (..., (1 + len(fused_layers)) × H): the final state first, then those layers'
    outputs in this order (`acchead.distill.features` stores them so)."""

    model_type = "acchead_feature_llama"

    def __init__(self, fused_layers: list[int] | None = None, **kwargs) -> None:
        self.fused_layers = list(fused_layers or [])
        super().__init__(**kwargs)


class FeatureDraftForCausalLM(ReducedVocabLlamaForCausalLM):
    """The feature draft (module docstring). `hidden_states` is its one entry point; `forward` refuses
    to run without the target's states, so it is never mistaken for an independent draft."""

    config_class = FeatureDraftConfig

    def __init__(self, config: FeatureDraftConfig) -> None:
        super().__init__(config)
        h = config.hidden_size
        fused = len(config.fused_layers)
        # [embedding; state; fused layers' states] -> H. Starts as the sum of the first two (the layer then
        # sees a residual-stream-like input); the fused states' columns start at zero.
        self.fc = nn.Linear((2 + fused) * h, h, bias=False)
        with torch.no_grad():
            self.fc.weight.copy_(torch.cat([torch.eye(h), torch.eye(h), torch.zeros(h, fused * h)], dim=1))

    @property
    def state_width(self) -> int:
        """The width of the states it reads: H, or (1 + len(fused_layers)) × H."""
        return self.fc.in_features - self.config.hidden_size

    def hidden_states(self, input_ids: torch.Tensor, features: torch.Tensor, **kwargs) -> torch.Tensor:
        """(B, T) next tokens t_{j+1} and (B, T, W) states f_j → (B, T, H) predicted states h_j.

        W is `state_width`, or H alone: a candidate past a round's first reads the draft's own guess h of
        the final state and has no fused layers' states, which read as zeros (as training's chain feeds
        them). Each fused layer's state is RMS-normalised first (a residual stream's scale grows with depth).
        `kwargs` go to the Llama stack: the KV cache (`acchead.models.CACHE_ARG`), `attention_mask`,
        `position_ids` (position j is the pair's index j, the position of f_j)."""
        emb = self.get_input_embeddings()(input_ids)  # (B, T, H)
        h, width = emb.shape[-1], self.state_width
        features = features.to(emb.dtype)
        weight = self.fc.weight  # (H, H + W)
        if features.shape[-1] < width:  # H wide: the fused states' columns would multiply zeros, so skip them
            weight = weight[:, : 2 * h]
        elif width > h:
            parts = features[..., h:].unflatten(-1, (-1, h))  # (B, T, fused, H)
            parts = parts * torch.rsqrt(parts.pow(2).mean(-1, keepdim=True) + 1e-6)  # zeros stay zeros
            features = torch.cat([features[..., :h], parts.flatten(-2)], dim=-1)  # (B, T, W)
        x = nn.functional.linear(torch.cat([emb, features], dim=-1), weight)  # (B, T, H)
        return self.model(inputs_embeds=x, **kwargs).last_hidden_state

    def forward(self, *args, **kwargs):
        raise TypeError(
            "a feature draft reads the target's hidden states: call hidden_states(input_ids, features) "
            "(acchead.inference.feature_drafter drives it in decoding)"
        )


class TargetFedDraft(nn.Module):
    """A feature draft teacher-forced on the target's states, as a causal LM over token ids alone.

    `forward(input_ids, attention_mask, position_ids, logits_to_keep, output_hidden_states)` runs the target's
    decoder stack over the ids (its states f), then the draft over the pairs (t_{j+1}, f_j): the output at
    position i is the draft's h_{i-1} and its logits, which predict token i + 1 as a causal LM's do; the
    first real position of each row has no pair and gets zeros (nothing reads it: it is a prompt's first
    token). The labeller's teacher-forced passes read a feature draft through it.

    With `levels` = 1 the states are the target's all along: every position is a round's *first*
    candidate. With `levels` = N > 1 the output at a position whose pair has position id j is the
    candidate of depth j mod N (`acchead.feature_chain`: the round started j mod N pairs before, the
    candidates between read the draft's own states), so labels and features cover a round's first N
    candidates alike, as decoding meets them; the depth is a function of the position alone, so two
    passes over sequences that share a prefix (X and the mixed Z) see the same depth at each position.

    Batches may be left-padded (`attention_mask`, 1 on real tokens); right padding is not supported.
    """

    def __init__(self, draft: FeatureDraftForCausalLM, target: nn.Module, levels: int = 1) -> None:
        super().__init__()
        if levels < 1:
            raise ValueError(f"levels must be >= 1, got {levels}")
        self.draft, self.target, self.levels = draft, target, levels
        self.config = draft.config

    @property
    def device(self) -> torch.device:
        return self.draft.device

    def get_output_embeddings(self) -> nn.Module:
        return self.draft.get_output_embeddings()

    def get_input_embeddings(self) -> nn.Module:
        return self.draft.get_input_embeddings()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        logits_to_keep: int = 0,
        output_hidden_states: bool = False,
        **unused,
    ):
        from transformers.modeling_outputs import CausalLMOutputWithPast

        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        t_dev = self.target.device
        states = target_states(
            self.target, tuple(self.draft.config.fused_layers), input_ids=input_ids.to(t_dev),
            attention_mask=attention_mask.to(t_dev),
            position_ids=position_ids.to(t_dev) if position_ids is not None else None,
        )  # fmt: skip  # (B, T, W)
        states = states.to(self.device)
        ids, mask = input_ids.to(self.device), attention_mask.to(self.device)
        pair_mask = mask[:, :-1] * mask[:, 1:]  # pair j: the state at column j, the token at j + 1: both real
        pair_pos = (pair_mask.cumsum(-1) - 1).clamp(min=0)  # (B, T - 1)
        if self.levels == 1:
            h = self.draft.hidden_states(ids[:, 1:], states[:, :-1], attention_mask=pair_mask,
                                         position_ids=pair_pos)  # fmt: skip  # (B, T - 1, H)
        else:
            outs = chain_hidden_states(self.draft, ids[:, 1:], states[:, :-1], pair_mask, self.levels)
            h = gather_levels(outs, pair_pos % self.levels)  # (B, T - 1, H): column j is position j + 1
        h = torch.cat([h.new_zeros(h.shape[0], 1, h.shape[2]), h], dim=1)  # (B, T, H)
        kept = h[:, -logits_to_keep:] if logits_to_keep else h
        logits = self.draft.lm_head(kept)
        return CausalLMOutputWithPast(logits=logits, hidden_states=(h,) if output_hidden_states else None)


def is_feature_draft(model: object) -> bool:
    """Whether `model` is a feature draft (needs the target's states to draft)."""
    return isinstance(model, FeatureDraftForCausalLM)


def register_auto_classes() -> None:
    """Let `AutoModelForCausalLM.from_pretrained` load a saved feature draft."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        AutoConfig.register(FeatureDraftConfig.model_type, FeatureDraftConfig)
        AutoModelForCausalLM.register(FeatureDraftConfig, FeatureDraftForCausalLM)
    except ValueError:  # already registered
        pass
