"""The hindsight oracle's reference: where the draft's candidates agree with the target's greedy output.

`SpeculativeDecoder` computes it before an oracle decode (`OracleRun`, `acchead.inference.policies`): the
oracle drafts, at each round, exactly the candidates that will be accepted, which it reads from this table.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from acchead.feature_chain import chain_hidden_states, target_states
from acchead.inference.host_reads import read
from acchead.kv_decode import KVSequence, decode


@torch.inference_mode()
def oracle_reference(
    target: PreTrainedModel,
    draft: PreTrainedModel,
    prompt: torch.Tensor,
    max_new_tokens: int,
    eos: set[int],
    state_layers: tuple[int, ...] | None = None,
) -> list[list[bool]]:
    """agree[k][i] = (the draft's greedy candidate of depth k at generated position i == the target's token).

    The target decodes greedily after `prompt` ((T,) int64; cached, one token per forward); the draft is
    teacher-forced over that output, which is exactly the context it sees under the oracle (no rejections):
    in one forward for a draft whose candidates do not depend on their depth (one level), level by level
    for a feature draft, whose later candidates read its own states (`acchead.feature_chain`), until no run
    of agreeing candidates reaches the next level. `state_layers`: None for a token-level draft; a feature
    draft's fused target layers (() for the final states alone).
    """
    seq = KVSequence(target)
    seq.feed(prompt[None])
    # Host-driven: one read per reference token (the loop's stop check), and one for the tokens.
    ref: list[int] = read(decode(seq, max_new_tokens, eos_ids=eos, host_read=read)[0])
    full = torch.cat([prompt, torch.tensor(ref)]).to(draft.device)[None]  # (1, T)
    n = prompt.numel()
    target_ids = torch.tensor(ref, device=full.device)
    if state_layers is None:
        logits = draft(input_ids=full).logits[0, n - 1 : -1]
        return [read(logits.argmax(-1) == target_ids)]
    # (1, T, W): the states the drafter reads while decoding
    states = target_states(target, state_layers, input_ids=full.to(target.device))
    levels: list[torch.Tensor] = []  # (len(ref),) bool per depth
    alive = torch.ones(len(ref), dtype=torch.bool, device=full.device)  # runs still agreeing, by position

    def agree(k: int, h: torch.Tensor) -> bool:  # h (1, T - 1, H): pair j draws token j + 2
        nonlocal alive
        drafted = draft.lm_head(h[0, max(n - 2, 0) : -1]).argmax(-1)  # (len(ref) or 1 fewer,)
        hit = torch.zeros_like(alive)
        hit[len(ref) - drafted.numel() :] = drafted == target_ids[len(ref) - drafted.numel() :]
        levels.append(hit)
        # a depth-k run ending at i started at i - k: alive there at depth k - 1 and a hit here
        alive = hit if k == 0 else torch.cat([alive.new_zeros(1), alive[:-1]]) & hit
        return bool(alive.any())

    chain_hidden_states(draft, full[:, 1:], states[:, :-1].to(full.device),
                        torch.ones_like(full[:, 1:]), len(ref), keep_going=agree)  # fmt: skip
    return [read(level) for level in levels]
