"""The sampling configuration S and the distributions it induces, exactly as transformers' `generate` does.

Order (transformers' `_get_logits_processor`): temperature, then top-k, then top-p; each warper masks
with -inf and the result is softmaxed. Greedy (temperature 0) is the one-hot distribution at the argmax
(first index on ties, as `torch.argmax`). Data generation and every decoder go through `probs_from_logits`
so that labels and decoding see the same p and q.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch loads where it is used: the CLIs parse S before they need it
    import torch


@dataclass(frozen=True)
class SamplingConfig:
    """Sampling configuration S shared by label generation and decoding.

    Attributes:
        temperature: 0 means greedy; otherwise logits are divided by it.
        top_k: keep the k most likely tokens (0 = off).
        top_p: keep the smallest set whose probability reaches top_p (1.0 = off).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> SamplingConfig:
        return cls(temperature=float(d["temperature"]), top_k=int(d["top_k"]), top_p=float(d["top_p"]))

    def __str__(self) -> str:
        if self.greedy:
            return "greedy"
        return f"temperature={self.temperature:g},top_k={self.top_k},top_p={self.top_p:g}"


def process_logits(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Warped logits (-inf outside the kept set); logits: (..., vocab) -> (..., vocab) float32.

    For greedy, returns 0 at the argmax and -inf elsewhere.
    """
    import torch

    x = logits.float()
    if cfg.greedy:
        out = torch.full_like(x, -math.inf)
        return out.scatter(-1, x.argmax(-1, keepdim=True), 0.0)
    if cfg.temperature != 1.0:
        x = x / cfg.temperature
    if cfg.top_k > 0:
        k = min(cfg.top_k, x.size(-1))
        kth = torch.topk(x, k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, -math.inf)
    if cfg.top_p < 1.0:
        # transformers' TopPLogitsWarper: sort ascending, drop tokens whose cumulative probability
        # is <= 1 - top_p, always keep the most likely token.
        sorted_logits, sorted_idx = torch.sort(x, descending=False, dim=-1)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = cum <= (1 - cfg.top_p)
        remove_sorted[..., -1:] = False
        remove = remove_sorted.scatter(-1, sorted_idx, remove_sorted)
        x = x.masked_fill(remove, -math.inf)
    return x


def probs_from_logits(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Distribution S(softmax(logits)); logits: (..., vocab) -> probs: (..., vocab) float32."""
    return process_logits(logits, cfg).softmax(dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row; probs: (..., vocab) -> (...) int64.

    Rows that put all their mass on one token (greedy decoding's distributions, and the verifier's under
    it) return that token without drawing: the same result, without `multinomial`'s ~0.2 ms per call on a
    CPU and without consuming the generator.
    """
    flat = probs.reshape(-1, probs.size(-1))
    top, arg = flat.max(dim=-1)
    if bool((top == 1).all()):
        return arg.reshape(probs.shape[:-1])
    import torch

    out = torch.multinomial(flat, 1, generator=generator).squeeze(-1)
    return out.reshape(probs.shape[:-1])
