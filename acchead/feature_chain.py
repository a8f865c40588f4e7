"""A feature draft's candidates past a round's first, teacher-forced: every position at every chain depth.

While decoding, a round that starts from the target's true state f_s drafts candidate 1 from the pair
(t_{s+1}, f_s); candidate k + 1 reads the draft's own guess of the state instead: the pair
(t_{s+k+1}, h_{s+k-1}), with the pairs s+1 .. s+k-1 of the same round in its cache beside the target-fed
pairs up to s. Training and labelling along a sequence teacher-forced see only first candidates (every
pair reads the target's state). This module computes, for every pair j of a sequence, the draft's output
as the candidate of depth k = 0..levels-1 of the round that started at pair s = j - k, exactly as decoding
computes it (EAGLE-3's "training-time test"), in `levels` forwards over one shared KV cache:

    level 0:  pair j reads (t_{j+1}, f_j)             attends level-0 pairs i <= j
    level k:  pair j reads (t_{j+1}, h^{k-1}_{j-1})   attends level-0 pairs i <= j - k and the level-m pair
                                                      j - k + m for m = 1..k (its own round's candidates)

The tokens read are the sequence's own (t_{j+1} = the target's tokens): a candidate matters only when the
candidates before it were accepted, and then (greedy) they equal the target's tokens. Position ids are the
pairs' indices at every level, as in decoding. A level-k pair whose round would start before the row's first
real pair attends to what exists of it (nothing reads it: it lies inside the prompt).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
from transformers import DynamicCache

from acchead.cache_keyword import CACHE_ARG


def chain_mask(pair_mask: torch.Tensor, level: int, dtype: torch.dtype) -> torch.Tensor:
    """The additive attention mask of level `level`'s pairs over the keys of levels 0..level.

    pair_mask: (B, T), 1 on real pairs. Returns (B, 1, T, (level + 1) * T): 0 where attended, the dtype's
    lowest value elsewhere. Keys are ordered level by level, as the shared cache holds them."""
    t = pair_mask.shape[1]
    dev = pair_mask.device
    real = pair_mask.bool()  # (B, T)
    j = torch.arange(t, device=dev)[:, None]  # (T, 1) the query's pair
    i = torch.arange(t, device=dev)[None, :]  # (1, T) the key's pair
    blocks = [(i <= j - level)[None] & real[:, None, :]]  # level-0 keys: the round's target-fed context
    for m in range(1, level + 1):  # the round's own candidates: the level-m pair j - level + m
        blocks.append((i == j - level + m)[None] & real[:, None, :])
    allowed = torch.cat(blocks, dim=-1)  # (B, T, (level + 1) T)
    allowed[:, :, level * t :] |= torch.eye(t, dtype=torch.bool, device=dev)  # every query sees itself
    zero = torch.zeros((), dtype=dtype, device=dev)
    return torch.where(allowed, zero, torch.finfo(dtype).min)[:, None]


def chain_hidden_states(
    draft,
    input_ids: torch.Tensor,
    states: torch.Tensor,
    pair_mask: torch.Tensor,
    levels: int,
    keep_going: Callable[[int, torch.Tensor], bool] | None = None,
) -> list[torch.Tensor]:
    """The draft's outputs at chain depths 0..levels-1 (module docstring).

    draft: a `FeatureDraftForCausalLM`; input_ids (B, T): t_{j+1} per pair j; states (B, T, W): the
    target's f_j (W = `draft.state_width`); pair_mask (B, T): 1 on real pairs (left or right padding).
    Returns one (B, T, H) tensor per level computed: level k's column j is the depth-k candidate's h of
    the round that started at pair j - k.
    `keep_going(k, h_k)`, when given, is asked after each level whether to compute the next (the oracle
    stops once no run of agreeing candidates is that long)."""
    position_ids = (pair_mask.cumsum(-1) - 1).clamp(min=0)  # (B, T)
    cache = DynamicCache()
    outs: list[torch.Tensor] = []
    reads = states  # (B, T, H): what each pair reads as its state
    for k in range(levels):
        mask = chain_mask(pair_mask, k, states.dtype)  # (B, 1, T, (k + 1) T)
        h = draft.hidden_states(
            input_ids, reads, attention_mask=mask, position_ids=position_ids, use_cache=True,
            **{CACHE_ARG: cache},
        )  # fmt: skip  # (B, T, H)
        outs.append(h)
        if k + 1 == levels or (keep_going is not None and not keep_going(k, h)):
            break
        # pair j reads h^k_{j-1}: the final state's guess, no fused layers' states (the draft reads zeros)
        reads = torch.cat([states[:, :1, : h.shape[-1]], h[:, :-1].to(states.dtype)], dim=1)
    return outs


def gather_levels(outs: list[torch.Tensor], level_of: torch.Tensor) -> torch.Tensor:
    """(B, T, H) whose column j is `outs[level_of[b, j]][b, j]`; level_of (B, T) int64 in [0, len(outs))."""
    stacked = torch.stack(outs)  # (L, B, T, H)
    index = level_of[None, :, :, None].expand(1, *stacked.shape[1:])
    return stacked.gather(0, index)[0]


def with_layers(
    final: torch.Tensor, hidden_states: tuple[torch.Tensor, ...], layers: tuple[int, ...], rows: int
) -> torch.Tensor:
    """The final states (B, rows, H) followed by decoder `layers`' outputs at the same positions →
    (B, rows, (1 + len(layers)) × H). `hidden_states` is transformers' tuple (the embeddings, then each
    layer's output; the last entry is normed, so a fused layer is below the last)."""
    return torch.cat([final, *(hidden_states[i + 1][:, -rows:] for i in layers)], dim=-1)


def target_states(target, layers: tuple[int, ...] = (), **kwargs) -> torch.Tensor:
    """The target's states over a forward of its decoder stack (`kwargs`: input_ids, masks, positions):
    (B, T, H) final hidden states, or with `layers` (a feature draft's `fused_layers`) (B, T, W) with those
    layers' outputs after them (`with_layers`)."""
    out = target.get_decoder()(**kwargs, output_hidden_states=bool(layers))
    states = out.last_hidden_state  # (B, T, H)
    return with_layers(states, out.hidden_states, layers, states.shape[1]) if layers else states


# Models whose decoder stack has run once asking for its layers' outputs (`install_output_hooks`).
_HOOKED: weakref.WeakSet = weakref.WeakSet()


@torch.inference_mode()
def install_output_hooks(model) -> None:
    """Run one eager one-token forward of `model`'s decoder stack asking for its layers' outputs (once per
    model), so that transformers installs the forward hooks that collect them now: it installs them on
    first use, under a lock that a compiled graph cannot trace (torch._dynamo refuses the lock's context
    manager). The fast paths call it before a compiled forward that returns fused states."""
    if model in _HOOKED:
        return
    ids = torch.ones(1, 1, dtype=torch.long, device=model.device)
    model.get_decoder()(input_ids=ids, use_cache=False, output_hidden_states=True)
    _HOOKED.add(model)
