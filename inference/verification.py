"""Verification of a drafted block: how many candidates the target keeps, and what comes next.

Inputs, for one round (batch size 1):
    tokens: (L,) int64, the drafted candidates X_1..X_L (L may be 0)
    q:      (L, V) float32, the draft distribution each X_i was sampled from (q_i(X_i) > 0)
    p:      (L+1, V) float32, the target's distributions after the committed prefix + X_<i, i = 1..L+1

Each verifier is written as two exact pieces plus a thin sampler on top:
    *_tau_probs(tokens, q, p) -> (L+1,)   P(exactly τ candidates accepted), τ = 0..L
    *_next_dist(tokens, q, p, tau) -> (V,) distribution of the token emitted after the τ accepted ones
    verify_*(tokens, q, p, greedy, keys) -> (τ, next_token), both 0-d int64 tensors on p's device
so the exactness tests can enumerate every branch with its probability, and the sampler the decoder runs is
the very code they check. τ is drawn from its exact law rather than by scanning uniforms (the same
distribution, one draw), and both draws are counter-based (`acchead.inference.device_random`): nothing here
reads a value back to the host, and `tau` may be a device tensor everywhere.

Padded rounds (the fast path's verification of a fixed width, `acchead.inference.round_verifier`): every
function also takes `num`, the count of real candidates (an int or a 0-d tensor, so one compiled graph
serves every L up to the width); tokens[num:] and q[num:] are padding (q rows zero), p[num + 1:] is
ignored. τ never passes `num`, and the laws of τ and of the next token are those of the first `num`
candidates alone: the padded slots are rejected with probability 1 (token) or have h = 0 (block), and the
zero q row at slot `num` makes the residual there p_{num+1}, as `_pad_row` does unpadded.

Token verification (Leviathan et al. 2023; Chen et al. 2023): accept X_i with probability
min(1, p_i(X_i)/q_i(X_i)), stop at the first rejection, then sample norm(max(p_i − q_i, 0)).
Block verification (Sun et al. 2024; DESIGN §5): see `block_tau_probs`. Greedy decoding is the special
case of one-hot p and q, for which both reduce to "keep the longest agreeing prefix, then the target's
argmax".
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from acchead.inference.device_random import Word, sample_token

# (tokens, q, p, greedy, key_tau, key_next[, num]) -> (τ, next token), 0-d int64 tensors
Verifier = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, bool, Word, Word],
    tuple[torch.Tensor, torch.Tensor],
]


def _gather(dist: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """dist: (L, V), tokens: (L,) -> (L,) dist[i, tokens[i]]."""
    return dist.gather(-1, tokens.view(-1, 1).to(dist.device)).squeeze(-1)


def _normalise(residual: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """residual / sum; `fallback` if it sums to 0 (only on branches of probability 0, e.g. p == q).

    A `where`, not a branch: no host read of the sum."""
    total = residual.sum()
    return torch.where(total > 0, residual / total.clamp_min(torch.finfo(residual.dtype).tiny), fallback)


def _at(rows: torch.Tensor, tau: torch.Tensor | int) -> torch.Tensor:
    """rows: (L+1, V) -> (V,) rows[τ], with τ an int or a 0-d device tensor (no host read)."""
    index = torch.as_tensor(tau, dtype=torch.long, device=rows.device).view(1, 1).expand(1, rows.shape[-1])
    return rows.gather(0, index)[0]


def _pad_row(q: torch.Tensor) -> torch.Tensor:
    """(L, V) -> (L+1, V) with a zero last row: the residual at τ = L is then p_{L+1} itself."""
    return torch.cat([q, q.new_zeros(1, q.shape[-1])])


def _work_dtype(p: torch.Tensor) -> torch.dtype:
    """float32 at least (DESIGN §5); float64 inputs (the exactness tests) stay float64."""
    return torch.float64 if p.dtype == torch.float64 else torch.float32


def _real(n: int, num: torch.Tensor | int | None, device: torch.device) -> torch.Tensor | None:
    """(n,) bool, which of n candidate slots hold real candidates (the first `num`); None if all do."""
    if num is None:
        return None
    return torch.arange(n, device=device) < torch.as_tensor(num, device=device)


def _check(tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor) -> int:
    n = tokens.numel()
    if q.shape[0] != n or p.shape[0] != n + 1 or (n and q.shape[-1] != p.shape[-1]):
        raise ValueError(f"need tokens (L,), q (L, V), p (L+1, V); got {tuple(tokens.shape)}, "
                         f"{tuple(q.shape)}, {tuple(p.shape)}")
    return n


# ---------------------------------------------------------------------------------------------- token


def token_accept_probs(
    tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor, num: torch.Tensor | int | None = None
) -> torch.Tensor:
    """(L,) min(1, p_i(X_i) / q_i(X_i)) — also the gen-data label of each candidate; 0 past `num`."""
    n = _check(tokens, q, p)
    pq = _gather(p[:-1], tokens)
    qq = _gather(q, tokens)
    # q_i(X_i) > 0 for a sampled X_i; the clamp only keeps impossible branches finite.
    a = torch.clamp(pq / qq.clamp_min(torch.finfo(qq.dtype).tiny), max=1.0)
    real = _real(n, num, a.device)
    return a if real is None else torch.where(real, a, torch.zeros_like(a))


def token_tau_probs(
    tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor, num: torch.Tensor | int | None = None
) -> torch.Tensor:
    """(L+1,) P(τ = i) = Π_{j≤i} a_j · (1 − a_{i+1}), with a_{L+1} := 0 (and a_j := 0 for j > num)."""
    a = token_accept_probs(tokens, q, p, num)
    survive = torch.cat([a.new_ones(1), torch.cumprod(a, 0)])  # P(τ ≥ i), i = 0..L
    reject_next = torch.cat([1 - a, a.new_ones(1)])  # P(stop at i | reached i): reject X_{i+1}; τ = L stops
    return survive * reject_next


def token_next_dist(
    tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor, tau: torch.Tensor | int
) -> torch.Tensor:
    """(V,) next token after τ acceptances: norm(max(p_{τ+1} − q_{τ+1}, 0)) if τ < L, else p_{L+1}
    (padded: q's row `num` is zero, so τ = num gives p_{num+1})."""
    _check(tokens, q, p)
    p_tau = _at(p, tau)
    return _normalise((p_tau - _at(_pad_row(q.to(p.dtype)), tau)).clamp_min(0), fallback=p_tau)


def verify_token(
    tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor, greedy: bool, key_tau: Word, key_next: Word,
    num: torch.Tensor | int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Token verification: (τ, the token emitted after the τ accepted candidates), 0-d int64 on p's device.

    Under greedy decoding (one-hot p and q) both laws are one-hot, so τ and the token are argmaxes. The
    race draws τ over L + 1 slots whose padded ones have probability 0: the same draw as unpadded (each
    slot's exponential depends on the key and its index only)."""
    tau = sample_token(token_tau_probs(tokens, q, p, num), greedy, key_tau)
    return tau, sample_token(token_next_dist(tokens, q, p, tau), greedy, key_next)


# ---------------------------------------------------------------------------------------------- block


def block_rho(
    tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor, num: torch.Tensor | int | None = None
) -> torch.Tensor:
    """(L+1,) ρ_0 = 1, ρ_i = min(ρ_{i−1} · p_i(X_i)/q_i(X_i), 1), accumulated in log space (float32);
    padded slots (past `num`: q = 0) contribute a ratio of 1, so ρ stays finite there."""
    n = _check(tokens, q, p)
    dtype = _work_dtype(p)
    log_ratio = torch.log(_gather(p[:-1], tokens).to(dtype)) - torch.log(_gather(q, tokens).to(dtype))
    real = _real(n, num, log_ratio.device)
    if real is not None:
        log_ratio = torch.where(real, log_ratio, torch.zeros_like(log_ratio))
    # The running r_i = min(r_{i-1} + x_i, 0), r_0 = 0, in closed form: r_i = S_i − max_{j≤i} S_j with
    # S = [0, cumsum(x)] (by induction: min(S_i − M_{i-1}, 0) = S_i − max(M_{i-1}, S_i)). No host scan.
    # -inf (p_i(X_i) = 0) stays -inf from there on; M ≥ S_0 = 0 is always finite.
    s = torch.cat([log_ratio.new_zeros(1), torch.cumsum(log_ratio, 0)])
    return (s - torch.cummax(s, 0).values).exp()


def block_h(
    tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor, num: torch.Tensor | int | None = None
) -> torch.Tensor:
    """(L+1,) success probabilities h_0..h_L of the backward scan (DESIGN §5), h_0 := 1:

        Z_{i+1} = Σ_x max(ρ_i·p_{i+1}(x) − q_{i+1}(x), 0),   h_i = Z_{i+1} / (Z_{i+1} + 1 − ρ_i)  (0 < i < L,
        1 if the denominator is 0),   h_L = ρ_L.
    Padded (`num` real candidates): h_num = ρ_num and h_i = 0 for i > num.
    """
    n = _check(tokens, q, p)
    rho = block_rho(tokens, q, p, num)
    if n == 0:
        return rho
    z = (rho[1:n, None] * p[1:n].to(rho.dtype) - q[1:n].to(rho.dtype)).clamp_min(0).sum(-1)  # Z_2..Z_L
    denom = z + (1 - rho[1:n])
    h_inner = torch.where(denom > 0, z / denom.clamp_min(torch.finfo(z.dtype).tiny), torch.ones_like(z))
    # z / (z + (1 − ρ)) ≤ 1 in exact arithmetic; rounding can overshoot by an ulp and make 1 − h < 0.
    h_inner = h_inner.clamp(0.0, 1.0)
    h = torch.cat([rho.new_ones(1), h_inner, rho[n:]])
    if num is None:
        return h
    slot = torch.arange(n + 1, device=h.device)
    num = torch.as_tensor(num, device=h.device)
    return torch.where(slot < num, h, torch.where(slot == num, rho, torch.zeros_like(h)))


def block_tau_probs(
    tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor, num: torch.Tensor | int | None = None
) -> torch.Tensor:
    """(L+1,) P(τ = i) for block verification, τ = the LAST i with η_i ≤ h_i (η_i iid U(0,1); an early
    failure does not end the scan), 0 if none: P(τ = i) = h_i · Π_{j>i} (1 − h_j)."""
    h = block_h(tokens, q, p, num)
    fail = (1 - h).flip(0).cumprod(0).flip(0)  # Π_{j≥i} (1 − h_j)
    return h * torch.cat([fail[1:], fail.new_ones(1)])


def block_next_dist(
    tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor, tau: torch.Tensor | int,
    num: torch.Tensor | int | None = None,
) -> torch.Tensor:  # fmt: skip
    """(V,) next token after τ acceptances: norm(max(ρ_τ·p_{τ+1} − q_{τ+1}, 0)) if τ < L, else p_{L+1}.

    The residual is scaled by ρ_τ; the unscaled max(p − q, 0) of token verification is wrong here. At
    τ = L the padded q row is 0, so the residual is ρ_L·p_{L+1}, which normalises to p_{L+1}.
    """
    _check(tokens, q, p)
    rho = _at(block_rho(tokens, q, p, num)[:, None], tau)[0]  # ρ_τ depends on X_1..X_τ only
    p_tau = _at(p, tau)
    residual = (rho.to(p.dtype) * p_tau - _at(_pad_row(q.to(p.dtype)), tau)).clamp_min(0)
    return _normalise(residual, fallback=p_tau)


def verify_block(
    tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor, greedy: bool, key_tau: Word, key_next: Word,
    num: torch.Tensor | int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Block verification: (τ, the token emitted after the τ accepted candidates), 0-d int64 on p's device."""
    tau = sample_token(block_tau_probs(tokens, q, p, num), greedy, key_tau)
    return tau, sample_token(block_next_dist(tokens, q, p, tau, num), greedy, key_next)


VERIFIERS: dict[str, Verifier] = {"token": verify_token, "block": verify_block}
