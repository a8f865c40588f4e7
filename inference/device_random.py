"""Counter-based random numbers for the decoders: every draw is a pure function of its key.

A decode draws three kinds of numbers: the draft's samples, the verifier's τ, and the token the verifier
emits after the accepted candidates. Each draw is keyed by

    (seed, purpose, n0, slot, index)

where `n0` is the committed length when the round started (it grows every round, so keys never repeat
within a decode), `slot` the candidate's place in the round, and `index` the vocabulary entry (or τ value)
that the draw belongs to. The number is a hash of the key, built from 32-bit integer mixing in int64 (a
32-bit value times a constant below 2^31 stays below 2^63, so nothing overflows). The key's words are
mixed in Python integers when they are Python integers (a few µs), in tensor ops when they are device
tensors; the per-index work is two mixing rounds over a cached hash of the indices, with the key injected
in both, so draws under different keys are not permutations of one another. Why a hash instead of
`torch.Generator`:

- The same key gives the same bits on the CPU and on CUDA, eagerly and inside a compiled or captured graph
  (Inductor's generators differ from eager's by design, and a CUDA graph replays its Philox offsets).
- Nothing is consumed: a draw inside a branch that is not taken leaves the other draws unchanged, so the
  eager and captured paths see identical numbers however they are scheduled.
- It needs no state, so keys can be device tensors (`n0` of a round the host has not read yet).

Sampling uses the exponential race: `argmax(p / E)` with E_v = -log U_v iid Exp(1) is an exact draw from
the categorical p (the minimum of independent exponentials with rates p_v falls on v with probability
p_v / Σp). U = (h + 1/2) / 2^32 for a 32-bit hash h lies in the open interval (0, 1), so E > 0 always: a
zero E would give 0/0 = NaN for a token of probability 0, which argmax would pick.
"""

from __future__ import annotations

from functools import lru_cache

import torch

MASK32 = 0xFFFFFFFF
_SALT = 0x68E31DA4

# Purposes: one key space each, so a draft sample and a verifier draw never share numbers.
DRAFT = 1
TAU = 2
NEXT = 3

Word = torch.Tensor | int


def _fmix(h: Word) -> Word:
    """A 32-bit mixer (xorshift-multiply, constants < 2^31): a bijection of [0, 2^32) that avalanches.

    Works on Python ints and on int64 tensors alike."""
    h = h ^ (h >> 16)
    h = (h * 0x7FEB352D) & MASK32
    h = h ^ (h >> 15)
    h = (h * 0x2C1B3C6D) & MASK32
    return h ^ (h >> 16)


def _absorb(h: Word, word: Word) -> Word:
    """Mix one more 32-bit word into the running hash h."""
    return _fmix(h ^ _fmix((word & MASK32) ^ _SALT))


def key_hash(seed: int, purpose: int, n0: Word, slot: Word) -> Word:
    """The hash of (seed, purpose, n0, slot) in [0, 2^32): a Python int when n0 and slot are ints, else an
    int64 tensor (broadcast over n0 and slot). Seeds take 64 bits (two words); n0, slot < 2^32."""
    h = _fmix(seed & MASK32)
    for word in ((seed >> 32) & MASK32, purpose, n0, slot):
        h = _absorb(h, word)
    return h


def key_input(key: int, device: torch.device, as_tensor: bool) -> Word:
    """A key as a draw takes it: the int on an eager path; for a compiled unit a 0-d int64 tensor on
    `device` (an int would be a constant of the graph: one recompile per round), filled by a kernel
    (`torch.tensor(key, device="cuda")` would copy from pageable host memory, which synchronises)."""
    return torch.full((), key, dtype=torch.int64, device=device) if as_tensor else key


@lru_cache(maxsize=16)
def _index_hash(width: int, device: str) -> torch.Tensor:
    """(width,) int64: a fixed hash of each index 0..width-1 (computed once per width and device)."""
    return _fmix(torch.arange(width, dtype=torch.int64, device=device) ^ _SALT)


def uniform(key: Word, width: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """U(0, 1) draws, open at both ends, one per index 0..width-1 under `key`: (..., width) float64.

    key: a Python int from `key_hash`, or an int64 tensor (...) giving one key per row."""
    if torch.compiler.is_compiling():  # traced: computed in the graph (a constant Inductor folds)
        idx = _fmix(torch.arange(width, dtype=torch.int64, device=device) ^ _SALT)
    else:
        idx = _index_hash(width, str(torch.device(device)))
    if isinstance(key, torch.Tensor):
        key = key.to(idx.device).unsqueeze(-1)
    h = _fmix(_fmix(idx ^ key) ^ _absorb(key, 0x2545F491))
    return (h.to(torch.float64) + 0.5) * (2.0**-32)


def exponential(key: Word, width: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """(..., width) float64 Exp(1) draws, all > 0 and finite: E_v = -log U_v."""
    return -torch.log(uniform(key, width, device))


def race(weights: torch.Tensor, key: Word) -> torch.Tensor:
    """A draw from the categorical ∝ `weights` ((..., n) >= 0, not all 0 in a row), one per row: (...) int64.

    argmax(w / E) with E iid Exp(1) keyed by (key, index): exact for any non-negative weights, and entries
    of weight 0 are never drawn. key: a Python int, or a tensor (...) with one key per row of `weights`.
    """
    e = exponential(key, weights.shape[-1], weights.device)
    return (weights / e.to(weights.dtype)).argmax(-1)


def sample_token(probs: torch.Tensor, greedy: bool, key: Word) -> torch.Tensor:
    """One token from `probs` ((V,) or (..., V)): argmax under greedy (no draw), else the exponential race."""
    return probs.argmax(-1) if greedy else race(probs, key)
