"""Labels for responses generated elsewhere: one teacher-forced forward of each model over prompt + X.

A serving engine samples X (`acchead-gen-data --responses`); the labeller's online steps 1-3 (DESIGN §2,
`acchead.data_gen.labeler`) become one forward of each model over the left-padded prompt + X, which
gives q_i and p_i at every response position at once. Y_i is drawn from the same uniform of the same
stream as online, so for the same X the labels equal the online ones up to float rounding (a
full-sequence forward rounds differently from a KV-cached step).
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from acchead.data_gen.batch_layout import left_pad
from acchead.data_gen.streams import sample_inverse_cdf
from acchead.kv_decode import position_ids
from acchead.sampling import SamplingConfig, probs_from_logits

# Float32 elements of one chunk of (rows, positions, V) distributions in `label_teacher_forced`: S (a sort
# under top-p) makes a few copies, so a chunk costs a small multiple of 4 * this many bytes (~128 MiB).
TF_CHUNK_ELEMENTS = 2**25


@torch.no_grad()
def _response_logits(
    model: PreTrainedModel, seq_ids: torch.Tensor, seq_mask: torch.Tensor, n: int
) -> torch.Tensor:
    """The logits of the last n + 1 columns but the very last: (B, W) -> (B, n, V), right-aligned.

    With left-padded prompt+response rows, column j of the result predicts the token in column W - n + j,
    so row b's response position i (of len_b) is column n - len_b + i. Kept right-aligned, not gathered
    into place: the (B, n, V) tensor is the largest of the labelling and is never copied.
    """
    dev = model.device
    mask = seq_mask.to(dev)
    out = model(
        input_ids=seq_ids.to(dev), attention_mask=mask, position_ids=position_ids(mask), logits_to_keep=n + 1
    )
    return out.logits[:, :-1]


def _realign(x: torch.Tensor, start: torch.Tensor, to_right: bool) -> torch.Tensor:
    """Move (B, n) per-position values between left alignment (position i in column i) and right alignment
    (position i in column start[b] + i). Vacated columns repeat a neighbour (the callers ignore them)."""
    cols = torch.arange(x.size(1), device=x.device)[None]
    shift = start.to(x.device)[:, None]
    idx = (cols - shift).clamp(min=0) if to_right else (cols + shift).clamp(max=x.size(1) - 1)
    return x.gather(1, idx)


@torch.no_grad()
def label_teacher_forced(
    target: PreTrainedModel,
    draft: PreTrainedModel,
    prompts: list[list[int]],
    responses: list[list[int]],
    sampling: SamplingConfig,
    draft_uniforms: torch.Tensor,
    pad_id: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Label given responses: one teacher-forced forward of each model over prompt + X (DESIGN §2).

    p_i = S(p(.|x, X_<i)) and q_i = S(q(.|x, X_<i)) for every response position at once; Y_i ~ q_i by
    inverting q_i's CDF at column i of the row's draft stream, exactly as `sample_and_label` does at step i;
    label min(1, p_i(Y_i) / q_i(Y_i)). The draft runs first and keeps only Y and q(Y), so the two models'
    (B, N, V) logits are never held at once; S is applied in chunks of positions (`TF_CHUNK_ELEMENTS`).

    Rows are laid out as [left pad | prompt | response] (every row ends in the last column, the least
    padding for responses of any length mix); positions count real tokens only, as online.

    Args:
        prompts, responses: B token lists each; every response non-empty, every id inside both models'
            embeddings (the caller validates: `acchead.data_gen.responses`).
        draft_uniforms: (B, >= N) float64, row b's draft stream; position i draws Y_i with column i.
        pad_id: fed in padding positions (masked).

    Returns:
        (draft_ids, accept_prob): (B, N) CPU tensors, int64 and float32, N = the longest response; row b's
        first len(responses[b]) columns are its labels.
    """
    seqs = [p + r for p, r in zip(prompts, responses, strict=True)]
    seq_ids, seq_mask = left_pad(seqs, pad_id, torch.device("cpu"))
    n = max(len(r) for r in responses)
    start = torch.tensor([n - len(r) for r in responses])  # row b's first response column (right-aligned)

    q_logits = _response_logits(draft, seq_ids, seq_mask, n)  # (B, N, V_draft)
    if sampling.greedy:
        # S's one-hot q_i: Y_i is its argmax for any uniform and q_i(Y_i) = 1, bit for bit what
        # `sample_inverse_cdf` returns (`process_logits` picks the same first argmax); no (B, N, V) softmax.
        y = q_logits.argmax(-1)
        qy = torch.ones(y.shape, device=y.device)
    else:
        u = _realign(draft_uniforms[:, :n], start, to_right=True).to(q_logits.device)
        step = max(1, TF_CHUNK_ELEMENTS // (len(seqs) * q_logits.size(-1)))
        ys, qys = [], []
        for c in range(0, n, step):
            q = probs_from_logits(q_logits[:, c : c + step], sampling)  # (B, chunk, V_draft)
            ys.append(sample_inverse_cdf(q, u[:, c : c + step]))
            qys.append(q.gather(-1, ys[-1][..., None]).squeeze(-1))
            del q
        y, qy = torch.cat(ys, 1), torch.cat(qys, 1)  # (B, N), right-aligned
    del q_logits

    p_logits = _response_logits(target, seq_ids, seq_mask, n)  # (B, N, V_target)
    y_t = y.to(p_logits.device)
    # A draft token outside the target's vocabulary has p = 0 (as `_pad_vocab` makes it online).
    inside = y_t < p_logits.size(-1)
    y_in = torch.where(inside, y_t, 0)
    if sampling.greedy:
        py = (p_logits.argmax(-1) == y_in).float()  # the one-hot p_i at Y_i
    else:
        step = max(1, TF_CHUNK_ELEMENTS // (len(seqs) * p_logits.size(-1)))
        pys = []
        for c in range(0, n, step):
            p = probs_from_logits(p_logits[:, c : c + step], sampling)  # (B, chunk, V_target)
            pys.append(p.gather(-1, y_in[:, c : c + step, None]).squeeze(-1))
            del p
        py = torch.cat(pys, 1)
    py = torch.where(inside, py, 0.0).to(qy.device)
    accept = torch.clamp(py / qy, max=1.0)
    return _realign(y, start, to_right=False).cpu(), _realign(accept, start, to_right=False).float().cpu()
