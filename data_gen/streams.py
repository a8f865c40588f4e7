"""Each prompt's own random streams, and drawing a token from a distribution at a given uniform.

Each prompt has three independent streams of float64 uniforms (generation, draft sample, mixing) seeded
from `(seed, prompt_index, stream)` and drawn on the CPU, so a labelled row does not depend on which other
prompts share its batch, shard, process or device, and changing the mix ratio leaves X and Y unchanged
(`acchead.data_gen.labeler`). A token is drawn by inverting its CDF at the row's uniform
(`sample_inverse_cdf`): vectorised over the batch, with no per-row device synchronisation.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

STREAMS = ("generate", "draft", "mix")


def stream_seed(seed: int, prompt_index: int, stream: str) -> int:
    """A 63-bit seed for one prompt's random stream, a hash of (seed, prompt_index, stream)."""
    digest = hashlib.blake2b(f"{seed}:{prompt_index}:{stream}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def stream_uniforms(seed: int, prompt_index: int, stream: str, n: int) -> np.ndarray:
    """The first n float64 uniforms in [0, 1) of one prompt's stream: (n,)."""
    if stream not in STREAMS:
        raise ValueError(f"unknown stream {stream!r}")
    return np.random.default_rng(stream_seed(seed, prompt_index, stream)).random(n)


def sample_inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token per row, drawn by inverting the CDF at a given uniform: probs (..., V), u (...) -> (...).

    Returns the first index whose cumulative probability exceeds u * total, so P(i) = probs_i / total.
    The CDF is accumulated in float64; the clamp keeps a rounding of u * total up to the total from
    landing on a trailing zero-probability token. A one-hot row (greedy) returns its argmax for any u.
    """
    cdf = probs.double().cumsum(-1)
    idx = torch.searchsorted(cdf, (u.double() * cdf[..., -1]).unsqueeze(-1), right=True).squeeze(-1)
    last_positive = probs.size(-1) - 1 - (probs > 0).flip(-1).int().argmax(-1)
    return torch.minimum(idx, last_positive)
