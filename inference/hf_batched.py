"""A batch through transformers' `generate`: B left-padded prompts decoded at once by a `BatchedDecoder`.

    inputs = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left")
    out = target.generate(**inputs, draft=draft, custom_generate=hf.generate, max_new_tokens=64)

`acchead.inference.hf.generate` hands a batch here when `input_ids` has more than one row or its attention
mask pads a row. Each row's prompt is its unpadded tokens (the mask's ones, which must end the row: pad on
the left, as a decoder-only `generate` wants), and the rows decode as one ragged batch
(`acchead.inference.batched.BatchedDecoder`): each row an exact sample of the target on its own prompt
(greedy: token for token the row's greedy output alone, whatever the batch's padding), each with its own
EOS, stopping criteria (called on that row's unpadded prompt and tokens, one new token at a time) and seed
(`seed + b`). The output is `generate`'s: (B, T + N) with every prompt as it came in, padding included, then
its new tokens, a row that ended early filled with the pad id out to the longest row's N
(`generation_config.pad_token_id`, else the first EOS id).

What a batch adds to `hf.generate`'s arguments: `batch_stop`, the batch-level stop rule of a SpecDec++
batch (as `BatchedDecoder` takes it; by default c = 1 − h, `acchead-decode`'s: at B = 8 rows that stop on
their own ran 0.77x / 0.71x that rule on the toy / real pair, docs/results/hf-batched-s43/). What it
refuses, in one line each: a streamer (transformers' streamers take one sequence), right padding, and the
policies a batch cannot run (the bandits, model-free drafters: `BatchedDecoder`'s own refusals).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import GenerationConfig

from acchead.errors import AccheadError
from acchead.inference.batched import BatchedDecoder
from acchead.inference.results import BatchResult
from acchead.sampling import SamplingConfig


def needs_batch(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> bool:
    """Whether `generate`'s inputs are a batch: more than one row, or a row padded by its mask."""
    return input_ids.shape[0] > 1 or (attention_mask is not None and not bool((attention_mask == 1).all()))


def ragged_prompts(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> list[torch.Tensor]:
    """Each row's prompt, (T_b,) on the host: the tokens its mask keeps, which must be the row's last
    (left padding). input_ids, attention_mask: (B, T)."""
    if attention_mask is None:
        return list(input_ids.cpu())
    mask = attention_mask.cpu().bool()  # (B, T)
    if bool((mask.int().diff(dim=1) < 0).any()):  # a padded slot after a kept token
        raise AccheadError(
            "the attention mask pads a row on the right or inside: pad on the left (tokenizer "
            "padding_side='left'), as a decoder-only generate wants"
        )
    prompts = [ids[keep] for ids, keep in zip(input_ids.cpu(), mask, strict=True)]
    if empty := [b for b, p in enumerate(prompts) if p.numel() == 0]:
        raise AccheadError(f"row {empty[0]} of the batch is all padding: every row needs a prompt")
    return prompts


def padded_output(input_ids: torch.Tensor, new: list[torch.Tensor], pad_id: int | None) -> torch.Tensor:
    """(B, T + N): each row's input as given, then its new tokens ((N_b,) each), padded with `pad_id` to
    the longest row's N."""
    longest = max(n.numel() for n in new)
    if pad_id is None and any(n.numel() < longest for n in new):
        raise AccheadError(
            "rows of the batch ended at different lengths and the generation config has neither a "
            "pad_token_id nor an EOS id to pad them with: set generation_config.pad_token_id"
        )
    out = torch.full((len(new), longest), 0 if pad_id is None else pad_id, dtype=torch.long)
    for b, n in enumerate(new):
        out[b, : n.numel()] = n
    return torch.cat([input_ids, out.to(input_ids.device)], dim=1)


def generate_batch(
    decoder: BatchedDecoder,
    input_ids: torch.Tensor,
    prompts: list[torch.Tensor],
    config: GenerationConfig,
    sampling: SamplingConfig,
    *,
    max_new_tokens: int,
    eos: list[int],
    stop_checks: list[Any] | None,
    seed: int,
) -> tuple[torch.Tensor, BatchResult]:
    """Decode `generate`'s batch (see the module docstring) with `decoder`, `prompts` its rows unpadded
    (`ragged_prompts`): (B, T + N) sequences and the batch's result. `stop_checks`: one per row, or None."""
    res = decoder.generate(prompts, max_new_tokens=max_new_tokens, temperature=sampling.temperature,
                           top_k=sampling.top_k, top_p=sampling.top_p, seed=seed,
                           eos_token_id=eos or None, stop_checks=stop_checks)  # fmt: skip
    pad_id = config.pad_token_id if config.pad_token_id is not None else (eos[0] if eos else None)
    return padded_output(input_ids, [r.new_ids for r in res.rows], pad_id), res
