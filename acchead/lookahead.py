"""Head kinds, and the inputs of a `lookahead` head (DESIGN §3.1).

Two kinds of acceptance head read the draft's final hidden states s_j (the vectors its LM head reads):

- `candidate` (the paper's): f(e_k), e_k = s_k the state AFTER candidate Y_k was fed, predicts Y_k's
  acceptance; the first stop decision needs two draft forwards.
- `lookahead` (ours): f(s_{k-1}, Y_k) predicts Y_k's acceptance right after Y_k was sampled from q_k, from
  the state that produced q_k; no forward is spent on Y_k before it is judged.

Under sampling the acceptance min(1, p(Y)/q(Y)) depends on which token was drawn, so a lookahead head may
see the candidate, through inputs that cost no forward:

    state     s_{k-1}                                    (H,)
    logq      log q_k(Y_k), clamped to [-LOGQ_FLOOR, 0]  (1,)
    entropy   H(q_k) in nats                             (1,)
    token     the draft's output-embedding row of Y_k    (H,)  (its LM head's weight row)
    topk      the TOPK_WIDTH largest log-probs of q_k,     (8,)
              sorted, clamped like log q (the shape of the draft's doubt: one rival or many)
    depth     one-hot of min(k - 1, DEPTH_WIDTH - 1)      (4,)
              the candidate's place in its round: a feature (EAGLE) draft's later candidates read its own
              guesses of the target's states and pass less often (`acchead.feature_chain`); trained on
              gen-data `--feature-chain N` labels, where position j is the depth-(j mod N) candidate

A lookahead head reads any non-empty subset; the state is optional. On the real pair's 7,093 greedy labels a
head of the draft's statistics alone (`logq+entropy+topk`) ranks its misses better than one that also reads
the 576-wide state, which it overfits; on T = 1 labels the state helps (docs/real-pair.md, "What the head
reads").

q_k here is the distribution S(q) the candidate was drawn from; under greedy decoding S(q) is one-hot,
so `logq`, `entropy` and `topk` read softmax(logits) instead (the draft's real confidence, as the
confidence rule does). The same function builds the inputs at training time (from cached states, whose
logits are `state @ out_emb.T`) and at decoding time (from the drafter's own logits), so both see the
same numbers.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from acchead.errors import AccheadError
from acchead.sampling import SamplingConfig, probs_from_logits

HEAD_KINDS = ("candidate", "lookahead")
# Canonical order = layout order; new inputs go last so heads trained before them keep their layout.
LOOKAHEAD_INPUTS = ("state", "logq", "entropy", "token", "topk", "depth")
LOGQ_FLOOR = 30.0  # log q is clamped at -30: top-k/top-p zeros never reach the head as -inf
TOPK_WIDTH = 8  # how many of q's largest log-probs the "topk" input reads
DEPTH_WIDTH = 4  # the "depth" input's one-hot: candidates 1, 2, 3 and 4-or-later of a round


def check_kind(kind: str, inputs: Sequence[str]) -> tuple[str, ...]:
    """Validate a (kind, inputs) pair; returns inputs in canonical order. AccheadError on a bad one."""
    if kind not in HEAD_KINDS:
        raise AccheadError(f"unknown head kind {kind!r}; choose one of {', '.join(HEAD_KINDS)}")
    unknown = [x for x in inputs if x not in LOOKAHEAD_INPUTS]
    if unknown:
        raise AccheadError(f"unknown head inputs {unknown}; choose from {', '.join(LOOKAHEAD_INPUTS)}")
    canon = tuple(x for x in LOOKAHEAD_INPUTS if x in inputs)
    if not canon:
        raise AccheadError(f"a head needs at least one input; choose from {', '.join(LOOKAHEAD_INPUTS)}")
    if kind == "candidate" and canon != ("state",):
        raise AccheadError(f"a candidate head reads the state only, got inputs {list(canon)}")
    return canon


def parse_inputs(text: str) -> tuple[str, ...]:
    """'state+logq+entropy' (or comma-separated) -> ('state', 'logq', 'entropy')."""
    parts = [p.strip() for p in text.replace(",", "+").split("+") if p.strip()]
    return check_kind("lookahead", parts)


def input_width(name: str, hidden_size: int) -> int:
    """Width of one input in the head's vector: H for the state and the token's row, else its stats."""
    if name in ("state", "token"):
        return hidden_size
    return {"logq": 1, "entropy": 1, "topk": TOPK_WIDTH, "depth": DEPTH_WIDTH}[name]


def depth_one_hot(depth: torch.Tensor) -> torch.Tensor:
    """(N,) int64 depths (0 = a round's first candidate) -> (N, DEPTH_WIDTH) float32 one-hot, the last
    column for every depth past it."""
    return torch.nn.functional.one_hot(depth.long().clamp(0, DEPTH_WIDTH - 1), DEPTH_WIDTH).float()


def input_size(inputs: Sequence[str], hidden_size: int) -> int:
    """Width of the head's input vector."""
    return sum(input_width(x, hidden_size) for x in inputs)


def input_offset(inputs: Sequence[str], name: str, hidden_size: int) -> int:
    """Column where input `name` starts in the vector of canonical `inputs`."""
    return input_size(inputs[: inputs.index(name)], hidden_size)


def feature_logprobs(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """The log-distribution `logq`/`entropy`/`topk` read: log S(softmax(logits)), or log softmax(logits)
    under greedy (where S(q) is one-hot), clamped at -LOGQ_FLOOR (so top-k/top-p zeros stay finite).

    logits: (..., V) -> (..., V) float32.
    """
    if sampling.greedy:
        return torch.log_softmax(logits.float(), -1).clamp_min(-LOGQ_FLOOR)
    return probs_from_logits(logits, sampling).log().clamp_min(-LOGQ_FLOOR)


STATS_INPUTS = ("logq", "entropy", "topk")  # the inputs read from the log-distribution, in column order


def needs_stats(inputs: Sequence[str]) -> bool:
    """Whether the inputs read `candidate_stats` (log q, the entropy or the top log-probs)."""
    return any(x in inputs for x in STATS_INPUTS)


def candidate_stats(logprobs: torch.Tensor, token: torch.Tensor, inputs: Sequence[str]) -> torch.Tensor:
    """The columns of `inputs` that `feature_logprobs` feeds, in STATS_INPUTS order, per row:
    log q(token) (1), the entropy -Σ q log q in nats (1), the TOPK_WIDTH largest log q descending (8).

    logprobs (N, V) from `feature_logprobs`, token (N,) -> (N, W) float32, W = 1 + 1 + 8 at most.
    Only what `inputs` read is computed: the decoder calls this on one row per candidate, where each pass
    over V shows in the head's overhead.
    """
    parts = []
    if "logq" in inputs:
        parts.append(logprobs.gather(-1, token[:, None].long()))
    if "entropy" in inputs:
        parts.append(-torch.linalg.vecdot(logprobs.exp(), logprobs)[:, None])
    if "topk" in inputs:
        parts.append(logprobs.topk(TOPK_WIDTH, dim=-1).values)
    return torch.cat(parts, dim=-1)


def assemble_inputs(
    inputs: Sequence[str],
    state: torch.Tensor,
    token: torch.Tensor,
    out_emb: torch.Tensor | None,
    stats: torch.Tensor | None,
    depth: torch.Tensor | None = None,
) -> torch.Tensor:
    """Concatenate the head's inputs in canonical order: state (N, H) (read only for "state"), token (N,),
    out_emb (V, H) (read only for "token"), stats (N, W) from `candidate_stats(..., inputs)` (read only for
    "logq", "entropy" and "topk"), depth (N,) int64 (read only for "depth") -> (N, D) float32.

    The one place that lays the vector out; training (`lookahead_inputs`, the cached dataset) goes through
    it, and the decoder's one-row version (`acchead.inference.head_call.HeadCall`) is pinned to it by tests.
    """
    stats_inputs = [x for x in STATS_INPUTS if x in inputs]  # candidate_stats' columns, in order
    cols = {}
    for x in stats_inputs:
        lo = input_offset(stats_inputs, x, 0)
        cols[x] = slice(lo, lo + input_width(x, 0))
    if "depth" in inputs and depth is None:
        raise AccheadError("a head reading 'depth' needs each candidate's depth in its round")
    parts = []
    for name in inputs:
        if name == "state":
            parts.append(state.float())
        elif name == "token":
            parts.append(out_emb[token.long()].float())
        elif name == "depth":
            parts.append(depth_one_hot(depth).to(state.device))
        else:
            parts.append(stats[:, cols[name]])
    return torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0]


def lookahead_inputs(
    inputs: Sequence[str],
    state: torch.Tensor,
    token: torch.Tensor,
    out_emb: torch.Tensor,
    sampling: SamplingConfig,
    logits: torch.Tensor | None = None,
    depth: torch.Tensor | None = None,
) -> torch.Tensor:
    """The head's input vectors for N candidates.

    Args:
        inputs: canonical inputs (`check_kind`), e.g. ("state", "logq", "entropy", "token", "topk").
        state: (N, H) the draft states that produced each candidate's q.
        token: (N,) int64 candidate ids.
        out_emb: (V, H) the draft's output embedding (LM head weight).
        sampling: the decoding configuration S the candidates were drawn under.
        logits: (N, V) the draft's logits at those states; None computes `state @ out_emb.T` (training from
            cached states: exact for LM heads without bias or soft-capping, e.g. Llama).
        depth: (N,) int64 each candidate's depth in its round (0: the first), read only for "depth".
    Returns:
        (N, input_size(inputs, H)) float32.
    """
    stats = None
    if needs_stats(inputs):
        if logits is None:
            logits = state.float() @ out_emb.float().T  # (N, V)
        stats = candidate_stats(feature_logprobs(logits, sampling), token, inputs)  # (N, W)
    return assemble_inputs(inputs, state, token, out_emb, stats, depth)
