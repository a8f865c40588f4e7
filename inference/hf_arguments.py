"""How `generate`'s prepared arguments become the speculative decoder's (`acchead.inference.hf`).

S from the logits processors `generate` built, its stopping criteria split into what the decoder applies
itself (max length, EOS) and what it calls after each token, and the refusals of what it cannot honour:
beam search, several sequences per prompt, scores or states, model inputs it cannot feed, a filled cache.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from transformers import GenerationConfig
from transformers.generation import (
    EosTokenCriteria,
    LogitNormalization,
    LogitsProcessorList,
    MaxLengthCriteria,
    StoppingCriteriaList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from acchead.errors import AccheadError
from acchead.sampling import SamplingConfig

# The warpers S is made of, in the order `acchead.sampling` applies them (generate's order too).
_WARPERS = (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)
# The names generate gives the cache it prepares: `cache` from transformers 5.24, `past_key_values` before.
_CACHE_NAMES = ("cache", "past_key_values")
# Model inputs generate prepares for its own loops; the decoder recomputes what it needs of them.
_PREPARED = {"attention_mask", "position_ids", "logits_to_keep", "use_cache", "cache_position", *_CACHE_NAMES}


def sampling_from(processors: LogitsProcessorList | None, config: GenerationConfig) -> SamplingConfig:
    """S from the processors `generate` built: its temperature, top-k and top-p warpers, in that order.

    Greedy when `do_sample` is off (warpers then cannot move the argmax). `LogitNormalization` is a
    log-softmax: neither the argmax nor the softmax changes. Anything else is refused (AccheadError).
    """
    params: dict[str, float | int] = {}
    refused, last = [], -1
    for p in processors or ():
        kind = type(p)
        if kind is LogitNormalization:
            continue
        if kind not in _WARPERS or getattr(p, "filter_value", -math.inf) != -math.inf:
            refused.append(kind.__name__)
            continue
        if _WARPERS.index(kind) <= last or getattr(p, "min_tokens_to_keep", 1) != 1:
            refused.append(f"{kind.__name__} (repeated, reordered or min_tokens_to_keep > 1)")
            continue
        last = _WARPERS.index(kind)
        if kind is TemperatureLogitsWarper:
            params["temperature"] = float(p.temperature)
        elif kind is TopKLogitsWarper:
            params["top_k"] = int(p.top_k)
        else:
            params["top_p"] = float(p.top_p)
    if refused:
        raise AccheadError(f"logits processors the decoder cannot apply exactly: {', '.join(refused)}")
    if not config.do_sample:
        return SamplingConfig(0.0)
    try:
        return SamplingConfig(**params)
    except ValueError as e:
        raise AccheadError(str(e)) from None


def split_criteria(criteria: StoppingCriteriaList | None) -> tuple[int | None, list[int], list[Any]]:
    """(max_length, EOS ids, other criteria): the length and EOS criteria the decoder applies itself, and
    those it calls token by token. Several max-length criteria: the smallest length wins, as in a loop."""
    max_length: int | None = None
    eos: list[int] = []
    others = []
    for c in criteria or ():
        if type(c) is MaxLengthCriteria:
            max_length = c.max_length if max_length is None else min(max_length, c.max_length)
        elif type(c) is EosTokenCriteria:
            eos += [t for t in torch.as_tensor(c.eos_token_id).flatten().tolist() if t not in eos]
        else:
            others.append(c)
    return max_length, eos, others


def check_config(config: GenerationConfig) -> None:
    if (config.num_beams or 1) > 1:
        raise AccheadError(f"num_beams={config.num_beams}: speculative decoding is not beam search")
    if (config.num_return_sequences or 1) > 1:
        raise AccheadError(
            f"num_return_sequences={config.num_return_sequences}: one sequence per call (vary seed= instead)"
        )
    wanted = [k for k in ("output_scores", "output_logits", "output_attentions", "output_hidden_states")
              if getattr(config, k, False)]  # fmt: skip
    if wanted:
        raise AccheadError(f"{', '.join(wanted)}: the decoder computes no scores, logits or states")


def check_inputs(input_ids: torch.Tensor, model_kwargs: dict[str, Any]) -> None:
    """(B, T) prompts, none empty, no cache to continue from, no other model inputs (the padding:
    `hf_batched.ragged_prompts`)."""
    if input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise AccheadError("the speculative decoder needs input_ids (inputs_embeds are not supported)")
    for name in _CACHE_NAMES:
        cache = model_kwargs.get(name)
        if cache is not None and hasattr(cache, "get_seq_length") and cache.get_seq_length() > 0:
            raise AccheadError(f"{name} holds tokens: the speculative decoder starts from the prompt")
    extra = sorted(k for k, v in model_kwargs.items() if k not in _PREPARED and v is not None)
    if extra:
        raise AccheadError(f"model inputs the speculative decoder cannot feed: {', '.join(extra)}")


def stop_check(criteria: list[Any], prompt: torch.Tensor, max_new_tokens: int):
    """The decoder's `stop_check`: after each round, the criteria on prompt + tokens so far, one new
    token at a time; returns how many of the round's tokens to keep when one fires (that token included)."""
    stopping = StoppingCriteriaList(criteria)
    ids = torch.empty(1, prompt.shape[1] + max_new_tokens, dtype=torch.long, device=prompt.device)
    ids[:, : prompt.shape[1]] = prompt
    length = prompt.shape[1]

    def check(new: list[int]) -> int | None:
        nonlocal length
        for i, token in enumerate(new):
            ids[0, length] = token
            length += 1
            if bool(stopping(ids[:, :length], None).any()):
                return i + 1
        return None

    return check
