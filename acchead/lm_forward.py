"""The forward the decoders run: a causal LM's decoder stack, then its LM head over the positions kept.

Why not `model(..., logits_to_keep=keep)`: on the CPU, PyTorch's `F.linear` over a few rows is far slower
than one row per row would suggest. Measured on the 2-core box (AMD EPYC, torch 2.13.0+cpu, 1 thread,
2026-11-25), SmolLM2's LM head (49,152 × 576, float32): 20 ms for one row, 44 ms for 2, 66 ms for 3, 34
ms for 4 — while the same product written as W·hᵀ takes 17, 11, 16 and 15 ms. A speculative round verifies
L + 1 positions, so its LM head paid 2-4× an autoregressive step's: most of why the eager two-token
verification cost 1.75× a one-token step on that pair (docs/speed.md). `head_logits` takes the W·hᵀ
form for a bias-free `nn.Linear` head on the CPU in float32 (the case measured); elsewhere it calls the
head. Either way the values are the head's product, up to float rounding (the order of the sums).

`lm_forward` runs `model.get_decoder()` (public API) and `head_logits` (with the logits' soft cap of a model
that has one, Gemma 2's), after checking once per model that this equals the model's own forward (no other
logit scaling after the head, as some architectures add); a model where it does not runs its own forward.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from transformers import PreTrainedModel

from acchead.feature_chain import with_layers
from acchead.models import final_hidden

# Per model: does decoder stack + `head_logits` reproduce its logits? Checked once, freed with the model.
_SPLITS: weakref.WeakKeyDictionary[PreTrainedModel, bool] = weakref.WeakKeyDictionary()


def head_logits(model: PreTrainedModel, hidden: torch.Tensor) -> torch.Tensor:
    """The LM head of `model` over `hidden` (..., H) → logits (..., V) (see the module docstring)."""
    head = model.get_output_embeddings()
    weight = getattr(head, "weight", None)
    if (
        type(head) is torch.nn.Linear
        and head.bias is None
        and hidden.device.type == "cpu"
        and hidden.dtype == weight.dtype == torch.float32
    ):
        flat = hidden.reshape(-1, hidden.shape[-1])  # (M, H)
        logits = (weight @ flat.T).T.contiguous().view(*hidden.shape[:-1], weight.shape[0])  # (..., V)
    else:
        logits = head(hidden)
    cap = getattr(model.config, "final_logit_softcapping", None)  # Gemma 2's: cap · tanh(logits / cap)
    return logits if not cap else torch.tanh(logits / cap) * cap


def splits_cleanly(model: PreTrainedModel) -> bool:
    """Whether `model`'s logits are `head_logits` of its decoder's last hidden state (checked on three
    tokens, once per model)."""
    ok = _SPLITS.get(model)
    if ok is None:
        # A few distinct ids: a padding id alone can have a zero embedding and zero logits, equal to anything.
        ids = torch.arange(1, 4, device=model.device)[None] % model.config.vocab_size
        with torch.inference_mode():
            ref = model(input_ids=ids, use_cache=False).logits
            try:
                hidden = model.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state
                ours = head_logits(model, hidden)
            except (AttributeError, NotImplementedError, TypeError):  # no decoder stack to call apart
                ours = None
        ok = (
            ours is not None
            and ours.shape == ref.shape
            and torch.allclose(ours.float(), ref.float(), rtol=1e-3, atol=1e-3)
        )
        _SPLITS[model] = ok
    return ok


def lm_forward(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    keep: int,
    want_hidden: bool,
    hidden_rows: int | None = None,
    features: torch.Tensor | None = None,
    state_layers: tuple[int, ...] = (),
    split_checked: bool = False,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One forward of `model` over `input_ids` (B, n) with `kwargs` (the cache, masks, positions).

    `features` (B, n, W): `model` is a feature draft (`acchead.feature_draft`) and these are the states its
    pairs read beside the ids (its `hidden_states`, then its head). Returns logits (B, keep, V) of the last
    `keep` positions and, if `want_hidden`, the final hidden states (B, hidden_rows, H) of the last
    `hidden_rows` positions (default `keep`; what the LM head read there), else None. `state_layers`: the
    hidden states are (B, hidden_rows, (1 + len) × H), the final state then those decoder layers' outputs
    (the states a feature draft with `fused_layers` reads; its target's forward only). `split_checked`: the
    caller has checked `splits_cleanly` (a compiled unit: a lookup in its weak dictionary inside a graph
    would make dynamo guard on the dictionary's keys, which change as models are freed).
    """
    rows = keep if hidden_rows is None else hidden_rows
    if features is not None:  # a feature draft has no plain forward over ids
        full = model.hidden_states(input_ids, features.to(input_ids.device), **kwargs)  # (B, n, H)
        return model.lm_head(full[:, -keep:]), full[:, -rows:] if want_hidden else None
    fused = want_hidden and bool(state_layers)
    if not split_checked and not splits_cleanly(model):
        out = model(input_ids=input_ids, logits_to_keep=keep, output_hidden_states=want_hidden, **kwargs)
        hidden = final_hidden(out)[:, -rows:] if want_hidden else None
        if fused:
            hidden = with_layers(hidden, out.hidden_states, state_layers, rows)
        return out.logits[:, -keep:], hidden
    out = model.get_decoder()(input_ids=input_ids, output_hidden_states=fused, **kwargs)
    full = out.last_hidden_state  # (B, n, H)
    hidden = full[:, -rows:] if want_hidden else None
    if fused:
        hidden = with_layers(hidden, out.hidden_states, state_layers, rows)
    return head_logits(model, full[:, -keep:]), hidden

