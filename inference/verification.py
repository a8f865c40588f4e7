"""Verification of a drafted block: how many candidates the target keeps, and what comes next.

Inputs, for one round (batch size 1):
    tokens: (L,) int64, the drafted candidates X_1..X_L (L may be 0)
    q:      (L, V) float32, the draft distribution each X_i was sampled from (q_i(X_i) > 0)
    p:      (L+1, V) float32, the target's distributions after the committed prefix + X_<i, i = 1..L+1

Each verifier is written as two exact pieces plus a thin sampler on top:
    *_tau_probs(tokens, q, p) -> (L+1,)   P(exactly τ candidates accepted), τ = 0..L
    *_next_dist(tokens, q, p, tau) -> (V,) distribution of the token emitted after the τ accepted ones
    verify_*(tokens, q, p, generator) -> (τ, next_token)
so the exactness tests can enumerate every branch with its probability, and the sampler the decoder runs is
the very code they check (τ is drawn from its exact law rather than by scanning uniforms — the same
distribution, one random draw, one host sync).

Token verification (Leviathan et al. 2023; Chen et al. 2023): accept X_i with probability
min(1, p_i(X_i)/q_i(X_i)), stop at the first rejection, then sample norm(max(p_i − q_i, 0)).
Block verification (Sun et al. 2024; DESIGN §5): see `block_tau_probs`. Greedy decoding is the special
case of one-hot p and q, for which both reduce to "keep the longest agreeing prefix, then the target's
argmax".
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from acchead.sampling import sample

Verifier = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Generator | None], tuple[int, int]]


def _gather(dist: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """dist: (L, V), tokens: (L,) -> (L,) dist[i, tokens[i]]."""
    return dist.gather(-1, tokens.view(-1, 1).to(dist.device)).squeeze(-1)


def _normalise(residual: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """residual / sum; `fallback` if it sums to 0 (only on branches of probability 0, e.g. p == q)."""
    total = residual.sum()
    if total <= 0:
        return fallback
    return residual / total


def _work_dtype(p: torch.Tensor) -> torch.dtype:
    """float32 at least (DESIGN §5); float64 inputs (the exactness tests) stay float64."""
    return torch.float64 if p.dtype == torch.float64 else torch.float32


def _check(tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor) -> int:
    n = tokens.numel()
    if q.shape[0] != n or p.shape[0] != n + 1 or (n and q.shape[-1] != p.shape[-1]):
        raise ValueError(f"need tokens (L,), q (L, V), p (L+1, V); got {tuple(tokens.shape)}, "
                         f"{tuple(q.shape)}, {tuple(p.shape)}")
    return n


# ---------------------------------------------------------------------------------------------- token


def token_accept_probs(tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """(L,) min(1, p_i(X_i) / q_i(X_i)) — also the gen-data label of each candidate."""
    _check(tokens, q, p)
    pq = _gather(p[:-1], tokens)
    qq = _gather(q, tokens)
    # q_i(X_i) > 0 for a sampled X_i; the clamp only keeps impossible branches finite.
    return torch.clamp(pq / qq.clamp_min(torch.finfo(qq.dtype).tiny), max=1.0)


def token_tau_probs(tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """(L+1,) P(τ = i) = Π_{j≤i} a_j · (1 − a_{i+1}), with a_{L+1} := 0."""
    a = token_accept_probs(tokens, q, p)
    survive = torch.cat([a.new_ones(1), torch.cumprod(a, 0)])  # P(τ ≥ i), i = 0..L
    reject_next = torch.cat([1 - a, a.new_ones(1)])  # P(stop at i | reached i): reject X_{i+1}; τ = L stops
    return survive * reject_next


def token_next_dist(tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor, tau: int) -> torch.Tensor:
    """(V,) next token after τ acceptances: norm(max(p_{τ+1} − q_{τ+1}, 0)) if τ < L, else p_{L+1}."""
    n = _check(tokens, q, p)
    if tau == n:
        return p[n]
    return _normalise((p[tau] - q[tau]).clamp_min(0), fallback=p[tau])


def verify_token(
    tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor, generator: torch.Generator | None = None
) -> tuple[int, int]:
    """Token verification; returns (number of accepted candidates τ, the token emitted after them)."""
    tau = int(sample(token_tau_probs(tokens, q, p), generator)) if tokens.numel() else 0
    return tau, int(sample(token_next_dist(tokens, q, p, tau), generator))


# ---------------------------------------------------------------------------------------------- block


def block_rho(tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """(L+1,) ρ_0 = 1, ρ_i = min(ρ_{i−1} · p_i(X_i)/q_i(X_i), 1), accumulated in log space (float32)."""
    _check(tokens, q, p)
    dtype = _work_dtype(p)
    log_ratio = torch.log(_gather(p[:-1], tokens).to(dtype)) - torch.log(_gather(q, tokens).to(dtype))
    # A running min(·, 0) is a sequential scan with no cumsum form; L is a few dozen at most, so scan on
    # the host (one transfer) rather than launch 2L tiny kernels. -inf (p_i(X_i) = 0) stays -inf.
    log_rho = [0.0]
    for lr in log_ratio.tolist():
        log_rho.append(min(log_rho[-1] + lr, 0.0))
    return torch.tensor(log_rho, dtype=dtype, device=p.device).exp()


def block_h(tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """(L+1,) success probabilities h_0..h_L of the backward scan (DESIGN §5), h_0 := 1:

        Z_{i+1} = Σ_x max(ρ_i·p_{i+1}(x) − q_{i+1}(x), 0),   h_i = Z_{i+1} / (Z_{i+1} + 1 − ρ_i)  (0 < i < L,
        1 if the denominator is 0),   h_L = ρ_L.
    """
    n = _check(tokens, q, p)
    rho = block_rho(tokens, q, p)
    if n == 0:
        return rho
    z = (rho[1:n, None] * p[1:n].to(rho.dtype) - q[1:n].to(rho.dtype)).clamp_min(0).sum(-1)  # Z_2..Z_L
    denom = z + (1 - rho[1:n])
    h_inner = torch.where(denom > 0, z / denom.clamp_min(torch.finfo(z.dtype).tiny), torch.ones_like(z))
    # z / (z + (1 − ρ)) ≤ 1 in exact arithmetic; rounding can overshoot by an ulp and make 1 − h < 0.
    h_inner = h_inner.clamp(0.0, 1.0)
    return torch.cat([rho.new_ones(1), h_inner, rho[n:]])


def block_tau_probs(tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """(L+1,) P(τ = i) for block verification, τ = the LAST i with η_i ≤ h_i (η_i iid U(0,1); an early
    failure does not end the scan), 0 if none: P(τ = i) = h_i · Π_{j>i} (1 − h_j)."""
    h = block_h(tokens, q, p)
    fail = (1 - h).flip(0).cumprod(0).flip(0)  # Π_{j≥i} (1 − h_j)
    return h * torch.cat([fail[1:], fail.new_ones(1)])


def block_next_dist(tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor, tau: int) -> torch.Tensor:
    """(V,) next token after τ acceptances: norm(max(ρ_τ·p_{τ+1} − q_{τ+1}, 0)) if τ < L, else p_{L+1}.

    The residual is scaled by ρ_τ; the unscaled max(p − q, 0) of token verification is wrong here.
    """
    n = _check(tokens, q, p)
    if tau == n:
        return p[n]
    rho = block_rho(tokens[:tau], q[:tau], p[: tau + 1])[tau]
    return _normalise((rho * p[tau] - q[tau]).clamp_min(0), fallback=p[tau])


def verify_block(
    tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor, generator: torch.Generator | None = None
) -> tuple[int, int]:
    """Block verification; returns (number of accepted candidates τ, the token emitted after them)."""
    tau = int(sample(block_tau_probs(tokens, q, p), generator)) if tokens.numel() else 0
    return tau, int(sample(block_next_dist(tokens, q, p, tau), generator))


VERIFIERS: dict[str, Verifier] = {"token": verify_token, "block": verify_block}
