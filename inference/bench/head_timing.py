"""Direct measurement of the acceptance head's cost relative to one draft decode step.

SpecDec++ adds one head call per drafted token. The fitted t_draft absorbs it, but the fit's noise is far
larger than the head (paper §4.2), so the bench times both directly: a draft decode step is one
draft forward of a single token on a KV cache holding a prompt (`acchead.kv_decode.KVSequence.feed`
with the final hidden state, as the eager decoders run it for SpecDec++), the cache cropped back after
each call; the head call is the head on that step's final hidden state plus the stop rule's update,
timed through `SpecDecPP.should_stop` (the exact code the decoder runs per candidate). A lookahead
head's call includes building its input from the candidate (log q and entropy from the draft's
distribution, the token's output-embedding row), as in decoding. Medians over many calls resist scheduler
noise.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch
from torch import nn

from acchead.feature_draft import is_feature_draft
from acchead.head import AcceptanceHead
from acchead.inference.drafters import DraftStep
from acchead.inference.specdecpp_policy import SpecDecPP
from acchead.kv_decode import KVSequence
from acchead.sampling import SamplingConfig, probs_from_logits
from acchead.step_cost import device_sync


@dataclass(frozen=True)
class HeadOverhead:
    """Median seconds per head call and per draft step, and their ratio."""

    head_s: float
    draft_step_s: float
    ratio: float
    calls: int
    context: int

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


def _median_time(fn, calls: int) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@torch.inference_mode()
def time_head_overhead(
    draft: nn.Module,
    head: AcceptanceHead,
    prompt_ids: torch.Tensor,
    calls: int = 200,
    sampling: SamplingConfig | None = None,
) -> HeadOverhead:
    """Time `calls` draft decode steps and `calls` head calls after `prompt_ids` (1, T); medians and ratio.

    Works for both head kinds: a candidate head reads the final hidden state; a lookahead head reads the
    state at the last prompt position (the one that produced q) plus its extra inputs, with the candidate's
    q built as the drafter builds it under `sampling` (default greedy: one-hot q, logits kept).
    """
    sampling = sampling or SamplingConfig(temperature=0.0)
    seq = KVSequence(draft, "the draft")  # the draft's step as the eager decoders run it

    def forward(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits (V,), final hidden state (H,)) of the last position of a KV-cached forward over ids."""
        states = None
        if is_feature_draft(draft):  # its step reads a state beside each token (zeros cost the same)
            states = torch.zeros(*ids.shape, draft.config.hidden_size, device=ids.device)
        logits, hidden = seq.feed(ids, want_hidden=True, features=states)  # (1, 1, V), (1, H)
        return logits[0, -1], hidden[0]

    logits, hidden = forward(prompt_ids)  # (V,), (H,)
    context = seq.length
    q = probs_from_logits(logits, sampling)
    token = logits.argmax(-1).view(1, 1)  # (1, 1): the greedy candidate (any token costs the same)
    # The stop decision is ignored: every call does the full head + running-product update.
    policy = SpecDecPP(head, h=0.5).to(hidden.device)
    policy.attach_draft(draft)  # a head reading "token" needs the draft's output embedding
    run = policy.start_decode()
    run.start_round(0)
    if policy.lookahead:  # judged from the state that produced q, before the candidate is fed
        kept = logits if sampling.greedy else None  # the drafter keeps the logits only under greedy
        step = DraftStep(token=int(token), q=q, hidden=None, index=1, logits=kept, state=hidden)
    else:
        step = DraftStep(token=int(token), q=q, hidden=hidden, index=1)
    device = prompt_ids.device

    def draft_step() -> None:
        forward(token)
        seq.crop(context)  # drop the token just added: every call sees the same context length
        device_sync(device)

    def head_call() -> None:
        run.should_stop(step)
        device_sync(device)

    for fn in (draft_step, head_call):  # warm-up: allocator, kernels, lazy init
        for _ in range(max(3, calls // 10)):
            fn()
    draft_s = _median_time(draft_step, calls)
    head_s = _median_time(head_call, calls)
    return HeadOverhead(
        head_s=head_s, draft_step_s=draft_s, ratio=head_s / draft_s, calls=calls, context=context
    )
