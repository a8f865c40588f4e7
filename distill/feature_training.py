"""Training a feature draft (`acchead.feature_draft`) on the target's responses and its states over them.

For a prompt + response t_0..t_{L-1} with the target's states f_0..f_{L-1} (`acchead.distill.features`),
the draft's pair j (j = 0..L-2) reads (t_{j+1}, f_j); its output h_j is trained towards f_{j+1} (smooth L1,
every pair: the states carry the prompt's meaning too) and its head towards t_{j+2}, the target's greedy
token, on response positions (cross-entropy over the head's rows; a token outside them is a sure miss).
Loss = regression + `cls_weight` × cross-entropy, the EAGLE recipe (weights 1 and 0.1), with uniform noise
of half-width `noise` added to the states read (EAGLE's augmentation: while drafting, the draft reads its
own imperfect states after the first candidate). `chain` = N trains the candidates of depths 1..N-1 of a
round too, each reading the draft's own guesses exactly as decoding feeds them (`acchead.feature_chain`).

Forwards and backwards run under bfloat16 autocast where the hardware computes in it
(`acchead.models.native_bfloat16`: a GPU, or a CPU with AMX, ~2× faster on recent Xeons, or AVX-512 BF16),
in float32 elsewhere (emulated bfloat16 trained 23 labelled tokens/s on an AVX2-only AMD EPYC, 2 threads,
2026-12-07); the weights and the optimizer stay float32, and `agreement` runs in float32, as decoding
does.

`FEATURE` is the `acchead.distill.draft.Objective` that `train_draft` takes for a feature draft; examples are
(ids (L-1,), labels (L-1,), states (L, H) float16) as `pack_feature_examples` makes them.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import torch

from acchead.distill.draft import IGNORE, Objective
from acchead.distill.responses import ResponseShard
from acchead.distill.teacher import TeacherShard
from acchead.feature_chain import chain_hidden_states
from acchead.models import native_bfloat16


def pack_feature_examples(
    shards: list[ResponseShard], states: list[list[np.ndarray]], to_draft: torch.Tensor, max_len: int
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(ids, labels, states) per response with a label: pair inputs t_{j+1}, labels the head row of
    t_{j+2} on response positions (OUTSIDE where the head lacks it, IGNORE on the prompt's), and the
    states f_0..f_{L-1} (float16) of the prompt + response cut to `max_len` + 1 tokens."""
    out = []
    for shard, shard_states in zip(shards, states, strict=True):
        for p, r, f in zip(shard.prompts, shard.responses, shard_states, strict=True):
            seq = (p + r)[: max_len + 1]
            if len(seq) <= len(p) or len(seq) < 3 or len(f) < len(seq):
                continue
            ids = torch.tensor(seq[1:])  # (L-1,) t_{j+1}
            labels = torch.full((len(seq) - 1,), IGNORE, dtype=torch.long)
            nxt = torch.tensor(seq[2:])  # (L-2,) t_{j+2}
            labels[: len(seq) - 2] = to_draft[nxt]
            labels[: max(len(p) - 2, 0)] = IGNORE  # t_{j+2} still the prompt's
            out.append((ids, labels, torch.from_numpy(np.ascontiguousarray(f[: len(seq)]))))
    return out


def pack_teacher_features(
    shards: list[TeacherShard], states: list[list[np.ndarray]], to_draft: torch.Tensor, max_len: int
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """`pack_feature_examples` of teacher exchanges (`acchead.distill.teacher`: text the target did not
    write): pair j reads (t_{j+1}, f_j) and learns the target's stored argmax after t_0..t_{j+1}, i.e.
    `labels[j + 2 - prompt_len]`, on reply positions; the states are the target's over the same text."""
    out = []
    for shard, shard_states in zip(shards, states, strict=True):
        for seq, p, lab, f in zip(shard.ids, shard.prompt_len, shard.labels, shard_states, strict=True):
            seq = seq[: max_len + 1]
            if len(seq) <= p or len(seq) < 3 or len(f) < len(seq):
                continue
            labels = torch.full((len(seq) - 1,), IGNORE, dtype=torch.long)
            first = max(p - 2, 0)  # the pair whose label is the argmax after the whole prompt (or later)
            n = len(seq) - 1 - first
            labels[first:] = to_draft[torch.tensor(lab[first + 2 - p : first + 2 - p + n])]
            ids = torch.tensor(seq[1:])  # (L-1,) t_{j+1}
            out.append((ids, labels, torch.from_numpy(np.ascontiguousarray(f[: len(seq)]))))
    return out


def collate_features(
    examples: list[tuple], pad_id: int, dtype: torch.dtype | None = None
) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """Right-padded (B, T) ids, (B, T) mask, (B, T) labels, (B, T, W) states read, (B, T, W) states
    to regress (the final state is their first H columns, `feature_loss` regresses those).

    The states keep the examples' dtype (float16 from the features stage and `--target-states`) unless
    `dtype` is given: the loss converts them to float32 on the training device, which on a GPU halves the
    bytes a batch copies there (an H200 trained host-bound, 2026-11-28); the values are the same.
    `acchead.distill.bench_collate` times both ways."""
    width = max(len(x) for x, _, _ in examples)
    h, dtype = examples[0][2].shape[1], dtype or examples[0][2].dtype
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, IGNORE)
    read = torch.zeros(len(examples), width, h, dtype=dtype)
    target = torch.zeros(len(examples), width, h, dtype=dtype)
    for i, (x, y, f) in enumerate(examples):
        n = len(x)
        ids[i, :n], mask[i, :n], labels[i, :n] = x, 1, y
        read[i, :n], target[i, :n] = f[:n], f[1 : n + 1]
    return ids, mask, labels, read, target


def feature_loss(
    draft, batch: tuple[torch.Tensor, ...], cls_weight: float = 0.1, noise: float = 0.1,
    teacher_rows: torch.Tensor | None = None, chain: int = 1,
) -> tuple[torch.Tensor, float]:  # fmt: skip
    """(regression + cls_weight × cross-entropy, top-1 accuracy at labelled positions) of a batch.

    With `teacher_rows` ((V_d, H): the target's LM-head rows of the draft's vocabulary), the cross-entropy
    is against the target's own distribution over those rows at EVERY pair, prompt included: softmax of
    f_{j+1} · rowsᵀ, the target's next-token distribution renormalised on V_d (soft labels, as EAGLE-3 and
    HASS distil), instead of the greedy token on response positions only.

    `chain` = N > 1: every pair also as the candidate of depths 1..N-1 of a round, reading the draft's own
    guesses of the states as decoding does (`acchead.feature_chain`, exact: the context of a depth-k
    candidate is the target-fed pairs up to its round's start and its round's candidates), with the same
    targets, each depth's loss added, the gradient flowing through the chain (EAGLE-3's training-time
    test). N forwards per step over one cache; the accuracy reported is depth 0's."""
    ids, mask, labels, read, target = batch
    # the states regressed (and softmaxed into soft labels) are the final ones: the first H of W columns
    final = target[..., : draft.config.hidden_size].float()  # (B, T, H)
    read = read.float()  # (B, T, W), as collated (float16 from the features)
    batch = (ids, mask, labels, read, final)
    if noise:
        read = read + (torch.rand_like(read) * 2 - 1) * noise
    with torch.autocast(ids.device.type, torch.bfloat16, enabled=native_bfloat16(ids.device)):
        if chain > 1:
            levels = chain_hidden_states(draft, ids, read, mask, chain)  # N × (B, T, H)
        else:
            levels = [draft.hidden_states(ids, read, attention_mask=mask)]  # (B, T, H)
    soft = None
    if teacher_rows is not None:  # every depth learns the same distribution: computed once per batch
        with torch.no_grad():
            nxt = final[mask.bool()]  # (N_real, H)
            soft = (nxt @ teacher_rows.T.to(nxt.dtype)).softmax(-1)  # (N_real, V_d)
    loss, acc = _step_loss(draft, levels[0], batch, cls_weight, soft)
    for hidden in levels[1:]:
        loss = loss + _step_loss(draft, hidden, batch, cls_weight, soft)[0]
    return loss, acc


def _step_loss(
    draft, hidden: torch.Tensor, batch: tuple[torch.Tensor, ...], cls_weight: float,
    soft: torch.Tensor | None,
) -> tuple[torch.Tensor, float]:  # fmt: skip
    """`feature_loss` of one forward's outputs `hidden` (B, T, H); `soft` (N_real, V_d): the target's
    distribution on the draft's rows at every real pair (soft labels), or None (greedy tokens)."""
    _, mask, labels, _, target = batch
    real = mask.bool()
    reg = torch.nn.functional.smooth_l1_loss(hidden[real].float(), target[real])
    keep = labels >= 0
    if soft is not None:
        logits = draft.lm_head.draft_logits(hidden[real].float())  # (N_real, V_d)
        cls = -(soft * logits.log_softmax(-1)).sum(-1).mean()
        scored = logits[keep[real]]
    else:
        scored = logits = draft.lm_head.draft_logits(hidden[keep].float())  # (N, V_d)
        cls = torch.nn.functional.cross_entropy(logits, labels[keep])
    return reg + cls_weight * cls, float((scored.argmax(-1) == labels[keep]).float().mean())


def feature_agreement(draft, examples: list[tuple], pad_id: int, batch_size: int = 8) -> float:
    """Top-1 agreement with the target's greedy tokens given the target's true states (float32): the
    share of response positions where the draft's argmax is the target's token (outside its head: a
    miss). It is the first candidate's agreement in decoding; later candidates read the draft's states
    (`agreement_by_depth`)."""
    return agreement_by_depth(draft, examples, pad_id, 1, batch_size)[0]


@torch.inference_mode()
def agreement_by_depth(
    draft, examples: list[tuple], pad_id: int, levels: int, batch_size: int = 8
) -> list[float]:
    """`feature_agreement` of every response position as the candidate of depth k = 0..levels-1 of a round
    (`acchead.feature_chain`: candidate k + 1 reads the draft's own guesses since the round's start), each
    over all positions, not conditioned on the candidates before it being accepted."""
    hits, total = [0] * levels, 0
    for b in range(0, len(examples), batch_size):
        batch = collate_features(examples[b : b + batch_size], pad_id)
        ids, mask, labels, read, _ = (t.to(draft.device) for t in batch)
        read = read.float()
        scored = labels != IGNORE
        for k, hidden in enumerate(chain_hidden_states(draft, ids, read, mask, levels)):
            pred = draft.lm_head.draft_logits(hidden[scored]).argmax(-1)
            hits[k] += int((pred == labels[scored]).sum())
        total += int(scored.sum())
    return [h / max(total, 1) for h in hits]


def feature_objective(
    cls_weight: float = 0.1, noise: float = 0.1, teacher_rows: torch.Tensor | None = None, chain: int = 1
) -> Objective:
    """The `Objective` of a feature draft (module docstring); `teacher_rows` (soft labels) and `chain`: see
    `feature_loss`."""
    loss = partial(feature_loss, cls_weight=cls_weight, noise=noise, teacher_rows=teacher_rows, chain=chain)
    return Objective(collate_features, loss, feature_agreement)
