"""The decoder's units: what runs in one compiled graph with a model's forward (the fast path's capture).

A round of speculative decoding is a chain of small steps; on a GPU each eager kernel between two graph
replays costs a launch, and each value read back costs a stream sync (issue 20 measured 0.81 ms for a draft
step whose bare replay costs 0.23 ms). So the work a forward's output feeds is traced into the forward's
own graph, through `ModelRunner.feed(..., post=...)`:

- `draft_post`, a draft step: S's processing of the logits (`probs_from_logits`), the candidate's draw
  (argmax under greedy, else the counter-keyed exponential race: no generator, no sync), and the stop
  rule's update and flag (`StopPolicy.judge`: the acceptance head as tensor ops, confidence, entropy,
  AdaEDL), all on the device. The flag is read by the host only where the policy needs a decision.
- `verify_post`, a verification: S's processing of the target's L + 1 rows, the verifier (token or
  block: τ from its exact law, the correction or bonus token) and the round's packed status
  [τ, next token, X_1..X_L], the one value the host reads per round.

Both are plain functions of tensors and constants, so the same code runs eagerly (`EagerRunner`, the
static cache with `compile=False`, the prompt's forward) and compiled: the exactness suites run the eager
path, the compiled path is checked against it token for token (tests/test_fast_path.py).

Keys of the random draws are Python ints on an eager path (hashed on the host, a few µs) and 0-d int64
tensors on a compiled one (a Python int would be a constant of the graph: one recompile per round).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from acchead.inference.device_random import Word, sample_token
from acchead.sampling import SamplingConfig, probs_from_logits


@dataclass
class DraftStep:
    """One proposed candidate.

    Attributes:
        token: the candidate token id: a 0-d int64 tensor on the drafter's device (a Python int from
            host-driven drafters and tests; both index tensors and fill the sequence alike).
        q: (V,) float32, the draft distribution the candidate was sampled from (after S's processing);
            one-hot for deterministic drafters.
        hidden: (H,) the drafter's final hidden state at the candidate's position — the vector its LM head
            reads after the candidate is fed (`acchead.models.final_hidden`), or None if not computed.
        index: 1-based position of the candidate within its round.
        logits: (V,) the draft's raw logits, kept only where q hides its confidence (greedy: q is one-hot);
            None otherwise.
        state: (H,) the drafter's final hidden state at the position BEFORE the candidate — the vector
            whose LM-head output is q (a lookahead head's input, DESIGN §3.1), or None if not computed.
        stop: 0-d bool, the stop rule's flag for this candidate when the draft's unit computed it
            (`StopPolicy.judge`); None: the policy computes it when asked.
    """

    token: torch.Tensor | int
    q: torch.Tensor
    hidden: torch.Tensor | None
    index: int
    logits: torch.Tensor | None = None
    state: torch.Tensor | None = None
    stop: torch.Tensor | None = None

    @property
    def confidence(self) -> torch.Tensor | None:
        """(V,) the distribution a confidence rule reads when it differs from q: softmax(logits) under
        greedy decoding (what Hugging Face's `assistant_confidence_threshold` reads); None means q.

        Computed on demand, so policies that never read it pay no softmax in the draft loop.
        """
        return None if self.logits is None else self.logits.float().softmax(-1)


# judge(step, stats) -> (stop flag: 0-d bool tensor, new stats); see `StopPolicy.judge`.
Judge = Callable[[DraftStep, torch.Tensor | None], tuple[torch.Tensor, torch.Tensor | None]]

SAMPLE = "sample"  # the rule judges the candidate drawn in this unit (reads q, its logits, the state)
FEED = "feed"  # the rule judges the candidate this unit fed (candidate heads read the hidden state after it)


def draft_post(
    logits: torch.Tensor,
    hidden: torch.Tensor | None,
    model: torch.nn.Module,
    cache: Any,
    sampling: SamplingConfig,
    key: Word,
    judge: Judge | None,
    judge_at: str,
    fed: torch.Tensor,
    stats: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None,
           torch.Tensor | None]:
    """A draft step after its forward: the next candidate and, with `judge`, a stop flag.

    Args:
        logits: (1, V) the draft's logits for the next position.
        hidden: (H,) the final hidden state at the last fed position (the state that produced `logits`,
            which is also the hidden state of the last fed token), or None.
        model, cache: the forward's (unused here; every post receives them).
        sampling: S; greedy draws are argmaxes.
        key: the draw's key (`key_hash(seed, DRAFT, round start, slot)`).
        judge: the stop rule's tensor update, or None (fixed K, unjudged candidates).
        judge_at: `SAMPLE` (judge the candidate drawn here) or `FEED` (judge the last fed token, `fed`).
        fed: 0-d int64, the last token this unit fed.
        stats: the rule's running state (e.g. SpecDec++'s log P̂), passed back updated.
    Returns:
        q (V,) float32, the candidate (0-d int64), the logits when greedy (a confidence rule's input;
        else None), `hidden`, the flag (0-d bool or None), the updated stats.
    """
    row = logits[-1]
    q = probs_from_logits(row, sampling)
    token = sample_token(q, sampling.greedy, key)
    kept = row if sampling.greedy else None
    flag = None
    if judge is not None:
        if judge_at == SAMPLE:
            step = DraftStep(token=token, q=q, hidden=None, index=0, logits=kept, state=hidden)
        else:  # a feed-time rule reads only the fed token and the hidden state after it, not q
            step = DraftStep(token=fed, q=row[:0], hidden=hidden, index=0)
        flag, stats = judge(step, stats)
    return q, token, kept, hidden, flag, stats


def draft_block_post(
    logits: torch.Tensor,
    hidden: torch.Tensor | None,
    model: torch.nn.Module,
    cache: Any,
    sampling: SamplingConfig,
    keys: torch.Tensor,
    count: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed-length draft round after its first forward: `count` candidates, each drawn and fed to the
    draft in turn, as one unit (fixed K never stops early, so nothing needs the host between steps).

    Args:
        logits: (1, V) the draft's logits after the committed tokens (the round's first forward).
        hidden: unused.
        model, cache: the draft and its KV cache, those of the forward before (passed by it, not as
            extra arguments: Inductor then treats the weights as the same frozen constants); candidates
            1..count-1 are fed through `step_forward` (the last candidate is not fed: the target verifies
            it, and the draft's next round re-feeds whatever it keeps).
        keys: (count,) int64, the draws' keys (`key_hash(seed, DRAFT, round start, 1..count)`).
    Returns:
        q (count, V) float32 and the candidates (count,) int64.
    """
    from acchead.inference.static_runner import step_forward

    row = logits[-1]
    qs, tokens = [], []
    for i in range(count):
        q = probs_from_logits(row, sampling)
        token = sample_token(q, sampling.greedy, keys[i])
        qs.append(q)
        tokens.append(token)
        if i + 1 < count:
            row = step_forward(model, cache, token.view(1, 1), 1, False)[0][-1]
    return torch.stack(qs), torch.stack(tokens)


def verify_post(
    logits: torch.Tensor,
    hidden: torch.Tensor | None,
    model: torch.nn.Module,
    cache: Any,
    tokens: torch.Tensor,
    q: torch.Tensor,
    sampling: SamplingConfig,
    verify: Callable,
    key_tau: Word,
    key_next: Word,
    num: torch.Tensor | None = None,
) -> tuple[torch.Tensor]:
    """A verification after the target's forward: the round's packed status.

    Args:
        logits: (L+1, V) the target's logits after the committed prefix + X_<i, i = 1..L+1.
        hidden, model, cache: unused (every post receives them).
        tokens: (L,) int64 the candidates; q: (L, V) float32 their draft distributions.
        verify: `verify_token` or `verify_block` (acchead.inference.verification).
        key_tau, key_next: the keys of the τ and next-token draws.
        num: a padded round's count of real candidates (0-d int64; the rest of `tokens` is padding, its
            q rows zero), so one graph of width L + 1 verifies every count up to L; None: all L are real.
    Returns:
        ((2 + L,) int64 [τ, next token, X_1..X_L],): everything the host needs after the round (τ ≤ num).
    """
    p = probs_from_logits(logits, sampling)  # (L+1, V)
    tau, nxt = verify(tokens, q, p, sampling.greedy, key_tau, key_next, num)
    return (torch.cat([tau.view(1), nxt.view(1), tokens]),)
