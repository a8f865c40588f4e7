"""How the labeller lays a batch out: `[left pad | prompt | response | right pad]`.

Every prompt ends in the same column P, so response position i sits in column P + i for every row. Pad
positions are masked out of attention and position ids count real tokens only
(`acchead.kv_decode.position_ids`).
"""

from __future__ import annotations

import torch


def left_pad(seqs: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists -> (ids, mask), both (B, max_len) int64; mask is 1 on real tokens."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, width - len(s) :] = torch.tensor(s, dtype=torch.long)
        mask[b, width - len(s) :] = 1
    return ids.to(device), mask.to(device)


def sequence_batch(
    prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, responses: list[list[int]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """[left-padded prompt | right-padded responses] -> (ids, mask), (B, P + N_max)."""
    n_max = max(len(r) for r in responses)
    resp = torch.full((len(responses), n_max), pad_id, dtype=torch.long)
    rmask = torch.zeros_like(resp)
    for b, r in enumerate(responses):
        resp[b, : len(r)] = torch.tensor(r, dtype=torch.long)
        rmask[b, : len(r)] = 1
    dev = prompt_ids.device
    return torch.cat([prompt_ids, resp.to(dev)], 1), torch.cat([prompt_mask, rmask.to(dev)], 1)
