"""Hugging Face transformers' own assisted generation on our pair, counted the way our decoders are; and
its plain `generate` of the target (method `hf-generate`), the autoregressive baseline a user compares with.

`target.generate(input_ids, assistant_model=draft, ...)` runs transformers' speculative decoding with its
default candidate schedule, read from the draft's `generation_config` (transformers 5.x defaults:
`num_assistant_tokens=20`, schedule `"constant"`, `assistant_confidence_threshold=0.4`: the draft stops a
round when its probability of the token it just produced falls below 0.4, or after 20 tokens; the threshold
is re-fitted online from an ROC curve only when scikit-learn is installed). Greedy decoding compares argmaxes;
sampling uses transformers' `_speculative_sampling` (Leviathan/Chen token verification).

How the counts are obtained (batch size 1):
- `target_calls`, `draft_calls`: a forward hook on each model's top module counts its forward passes.
  transformers' assisted loop does one target forward per round (the first one also encodes the prompt), and
  the assistant's inner `generate` does one forward per candidate token (its first forward of a round also
  re-encodes the last accepted token(s), but still yields exactly one token). So `draft_calls` is the
  number of proposed tokens.
- `tokens` = N, the new tokens returned.
- `discarded` = N_draft + N_target − N, i.e. eq. 2.2 of the cost model. Each round yields its accepted
  candidates plus one target token, so without truncation this equals proposed − accepted; in a round cut
  short by EOS or the length limit, the tokens transformers drops also count as discarded, exactly as in our
  decoders' accounting.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from acchead.sampling import SamplingConfig

METHOD = "hf-assisted"
GENERATE_METHOD = "hf-generate"  # transformers' plain `generate` of the target: its autoregressive baseline
HF_METHODS = (METHOD, GENERATE_METHOD)


@dataclass
class AssistedResult:
    """Output of one assisted-generation call; same stat names as `SpeculativeDecoder.generate`'s result.

    Attributes:
        new_ids: (N,) int64 generated token ids (prompt excluded).
    """

    new_ids: torch.Tensor
    tokens: int
    target_calls: int
    draft_calls: int
    discarded: int
    wall_time: float


class ForwardCounter:
    """Counts forward passes of a module through a forward hook; use as a context manager."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.calls = 0
        self._handle = None

    def _hook(self, module: nn.Module, args: tuple, output: object) -> None:
        self.calls += 1

    def __enter__(self) -> ForwardCounter:
        self.calls = 0
        self._handle = self.module.register_forward_hook(self._hook)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


@contextlib.contextmanager
def _count(
    target: nn.Module, draft: nn.Module | None
) -> Iterator[tuple[ForwardCounter, ForwardCounter | None]]:
    """Count the forwards of the target and (if any) the draft while the block runs."""
    if target is draft:
        # One module cannot tell its two roles apart by hooks; the bench never does this.
        raise ValueError("hf assisted generation needs two distinct model objects to count calls")
    draft_counter = ForwardCounter(draft) if draft is not None else contextlib.nullcontext()
    with ForwardCounter(target) as t, draft_counter as d:
        yield t, d


def schedule_params(draft: nn.Module) -> dict[str, object]:
    """The assistant settings transformers will use with `draft` (for the results table)."""
    cfg = draft.generation_config
    defaults = cfg._get_default_generation_params() if hasattr(cfg, "_get_default_generation_params") else {}

    def get(key: str) -> object:
        value = getattr(cfg, key, None)
        return defaults.get(key) if value is None else value

    try:
        import sklearn  # noqa: F401

        adaptive = True
    except ImportError:
        adaptive = False
    return {
        "num_assistant_tokens": get("num_assistant_tokens"),
        "schedule": get("num_assistant_tokens_schedule"),
        "confidence_threshold": get("assistant_confidence_threshold"),
        "adaptive_threshold": adaptive,
    }


def sampling_kwargs(sampling: SamplingConfig) -> dict[str, object]:
    """`generate` keyword arguments for S (transformers applies temperature → top-k → top-p, as we do)."""
    if sampling.greedy:
        return {"do_sample": False}
    return {
        "do_sample": True,
        "temperature": sampling.temperature,
        "top_k": sampling.top_k or None,
        "top_p": sampling.top_p,
    }


@torch.inference_mode()
def hf_assisted_generate(
    target: nn.Module,
    draft: nn.Module | None,
    input_ids: torch.Tensor,
    *,
    max_new_tokens: int,
    sampling: SamplingConfig,
    seed: int = 0,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
) -> AssistedResult:
    """Run transformers' assisted generation once (plain `generate` when `draft` is None) and count its
    forwards.

    Args:
        input_ids: (1, T) prompt ids on the models' device.
        seed: seeds torch's global generator (transformers samples from it).

    Returns:
        The new tokens and counts; see the module docstring for how they are derived.
    """
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"input_ids must be (1, T), got {tuple(input_ids.shape)}")
    torch.manual_seed(seed)
    pad = pad_token_id if pad_token_id is not None else eos_token_id
    kwargs = dict(
        max_new_tokens=max_new_tokens,
        min_new_tokens=0,
        eos_token_id=eos_token_id,
        pad_token_id=pad,
        attention_mask=torch.ones_like(input_ids),
        **sampling_kwargs(sampling),
    )
    if draft is not None:  # else plain `generate`: one target forward per token
        kwargs["assistant_model"] = draft
    with _count(target, draft) as (t_calls, d_counter):
        start = time.perf_counter()
        out = target.generate(input_ids, **kwargs)
        wall = time.perf_counter() - start
    d_calls = d_counter.calls if d_counter is not None else 0
    new_ids = out[0, input_ids.shape[1] :].detach().cpu()
    n = int(new_ids.numel())
    return AssistedResult(
        new_ids=new_ids,
        tokens=n,
        target_calls=t_calls.calls,
        draft_calls=d_calls,
        discarded=d_calls + t_calls.calls - n,
        wall_time=wall,
    )
