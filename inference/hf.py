"""SpecDec++ inside transformers' own `generate`: a `custom_generate` decoding loop that runs our decoder.

    from acchead.inference import hf

    out = target.generate(**inputs, draft=draft, custom_generate=hf.generate,
                          head="head.safetensors", max_new_tokens=128, do_sample=False)

`generate` prepares the inputs, the generation config, the logits processors and the stopping criteria, then
hands them to `generate` below (transformers 5.x calls a callable `custom_generate` in place of its own
decoding loop), which decodes with a `SpeculativeDecoder(target, draft, policy, head, verifier)`: exact, so
the output is distributed as transformers' own sampling from the target (greedy: token for token its
greedy output). Keyword arguments of our own: `draft` (the draft model), `stream_to` (a streamer),
`head` (an `AcceptanceHead` or a head file; None on the demo pair: its shipped head for the requested S),
`policy` (any spec of ours, default "specdecpp": the head's measured threshold), `verifier` ("token" or
"block"), `seed` and `fast` (as for `SpeculativeDecoder`), or `spec`, one `DecodingSpec` (or its string)
in place of policy, verifier, fast and head, as `acchead-decode` and the bench take it. Repeated calls
reuse one decoder per (target, draft, policy, head, verifier, fast), kept by
`acchead.inference.hf_decoders.DECODERS` (the 8 most recently used; `DECODERS.release(model)` lets a model
go).
The same loop ships as a directory for `custom_generate=custom_generate_dir(), trust_remote_code=True`,
which takes `generate`'s own `assistant_model=`, `streamer=`, `stop_strings=` and `tokenizer=`.

Why `draft=` and `stream_to=` in the callable form: transformers hands a `custom_generate` callable only the
keyword arguments its signature adds to `GenerationMixin._sample`'s, taken from `generate`'s `**kwargs`
(`_extract_generation_mode_kwargs`, 5.4 to 5.24 alike). `assistant_model` and `streamer` are named
parameters of `generate`, so they never reach the callable; a policy that needs a draft and gets none is
refused in one line that says to pass `draft=`. A `streamer=` given to the callable form receives only the
prompt (from `generate` itself): pass `stream_to=` instead, or use the directory form.

What is honoured, and how:
- S comes from the logits processors generate built: temperature -> top-k -> top-p (the order
  `acchead.sampling` applies); `do_sample=False` is greedy. Any other processor (repetition penalty, bad
  words, min_length / min_new_tokens, no_repeat_ngram, ...) changes the target's distribution in a way the
  verifier cannot reproduce, so it is refused with one line naming it.
- Stopping criteria: the max-length criterion becomes our `max_new_tokens`, the EOS criterion our EOS ids
  (every id of a list), and any other criterion (stop strings, max time, the caller's own) is called after
  each new token on prompt + tokens so far (with `scores=None`: we compute no scores); the first that fires
  ends generation keeping that token, as in `generate`'s loop.
- The streamer gets the prompt first, then one `put` of the new tokens per round, then `end()`, as from
  `generate`'s own loop.
- Sampled draws are keyed by `seed` (`acchead.inference.device_random`); `generate` takes no seed, so by
  default one is drawn from torch's global generator: `torch.manual_seed(s)` makes a call repeatable
  (greedy decoding draws nothing, and leaves the generator as plain greedy `generate` does).
- Returns what `generate` returns: (B, T + N) ids, or with `return_dict_in_generate=True` a
  `SpeculativeGenerateOutput` (`GenerateDecoderOnlyOutput` plus the round statistics). Scores, logits,
  attentions and hidden states are not computed: asking for them is refused.
- A batch, (B, T) prompts padded on the left, decodes as one ragged batch (`acchead.inference.hf_batched`:
  each row exact on its own prompt, `batch_stop=` its SpecDec++ batch rule); (B, T + N) comes back, rows
  that ended early padded with the pad id.

The tokenizer is lost on the way to a callable too, so `stop_strings=` raises in `generate` itself: pass
`stopping_criteria=StoppingCriteriaList([StopStringCriteria(tokenizer, [...])])`, or use the directory form,
which builds that criterion from `stop_strings` and `tokenizer`.

The cache `generate` prepared arrives as `model_kwargs["cache"]` (transformers >= 5.24) or
`model_kwargs["past_key_values"]` (earlier): both are accepted, checked empty, and not used.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig, PreTrainedModel
from transformers.generation import LogitsProcessorList, StoppingCriteriaList, StopStringCriteria
from transformers.generation.utils import GenerateDecoderOnlyOutput

from acchead.errors import AccheadError
from acchead.head import AcceptanceHead
from acchead.inference.batch_stop import BatchStop
from acchead.inference.drafter_spec import CopySpec
from acchead.inference.hf_arguments import (
    check_config,
    check_inputs,
    sampling_from,
    split_criteria,
    stop_check,
)
from acchead.inference.hf_batched import generate_batch, needs_batch, ragged_prompts
from acchead.inference.hf_decoders import decoder_for, pair_head_default
from acchead.inference.policies import StopPolicy
from acchead.inference.policy_spec import AutoregressiveSpec, PolicySpec, SpecDecPPSpec
from acchead.inference.results import BatchResult, GenerationResult
from acchead.inference.spec import DecodingSpec, as_policy_spec, spec_arguments, split_copy_rounds
from acchead.sampling import SamplingConfig


@dataclass
class SpeculativeGenerateOutput(GenerateDecoderOnlyOutput):
    """`generate`'s output with `return_dict_in_generate=True`, plus the speculative decode's statistics.

    Attributes:
        sequences: (B, T + N) int64, prompt + new tokens, on the prompt's device.
        scores, logits, attentions, hidden_states, past_key_values: always None (not computed).
        target_calls, draft_calls, drafted, discarded, rounds, head_calls: as in
            `acchead.inference.decoder.GenerationResult` (a batch: its batched forwards, its rows' sums).
        accepted_per_round, drafted_per_round: per round, τ and L (None for a batch: its rows differ).
    """

    target_calls: int | None = None
    draft_calls: int | None = None
    drafted: int | None = None
    discarded: int | None = None
    rounds: int | None = None
    head_calls: int | None = None
    accepted_per_round: list[int] | None = None
    drafted_per_round: list[int] | None = None


def generate(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    logits_processor: LogitsProcessorList | None = None,
    stopping_criteria: StoppingCriteriaList | None = None,
    generation_config: GenerationConfig | None = None,
    *,
    draft: PreTrainedModel | None = None,
    stream_to: Any = None,
    head: AcceptanceHead | str | Path | None = None,
    policy: str | PolicySpec | StopPolicy | None = None,
    verifier: str | None = None,
    seed: int | None = None,
    fast: bool | None = None,
    spec: DecodingSpec | str | None = None,
    batch_stop: bool | float | str | BatchStop | None = None,
    **model_kwargs: Any,
) -> torch.Tensor | SpeculativeGenerateOutput:
    """The decoding loop `model.generate(..., custom_generate=generate)` runs (see the module docstring).

    Args:
        model: the target. input_ids: (1, T) prompt, or (B, T) left-padded prompts (a batch:
            `acchead.inference.hf_batched`), prepared by `generate`.
        logits_processor, stopping_criteria, generation_config: as `generate` prepared them.
        draft: the draft model (`generate`'s `assistant_model` never reaches a callable: see above).
        stream_to: a streamer (`put`/`end`), fed as `generate` feeds its `streamer`.
        head, policy, verifier, fast: as for `SpeculativeDecoder` (policy None: "specdecpp", verifier
            None: "token"); head None with a named pair's draft (the demo draft, the shipped SmolLM2
            draft): its shipped head for the requested S (`pair_head_default`).
        spec: the typed decoding configuration (`acchead.inference.spec.DecodingSpec`, or its string
            form) instead of policy, verifier, fast and head: passing both is refused, as are a spec's
            model-free DRAFTER+ (Max-Gram, cascades: `acchead-decode` and the bench decode them) and a
            spec's sampling that differs from the generation config's; `copy+POLICY` adds copy rounds.
        seed: keys every sampled draw (row b of a batch: seed + b); None draws one from torch's global
            generator.
        batch_stop: a batch's stop rule for SpecDec++ (as `BatchedDecoder` takes it; False: rows stop on
            their own); None: c = 1 − h under SpecDec++ (`acchead-decode`'s default), none otherwise. Unused
            for one unpadded prompt, as by `BatchedDecoder` for a batch of one.
        model_kwargs: the model inputs `generate` prepared (attention mask, cache, ...): checked, not fed.

    Returns:
        (B, T + N) int64 on the prompt's device, or a `SpeculativeGenerateOutput` when the config asks
        for `return_dict_in_generate`.
    """
    if generation_config is None:
        raise AccheadError("call acchead.inference.hf.generate as model.generate(..., custom_generate=...)")
    check_config(generation_config)
    check_inputs(input_ids, model_kwargs)
    sampling = sampling_from(logits_processor, generation_config)
    copy_rounds = None
    if spec is not None:
        policy, verifier, fast, head, copy_rounds = _from_spec(spec, sampling, policy, verifier, fast, head)
    policy = "specdecpp" if policy is None else policy
    verifier = "token" if verifier is None else verifier
    if draft is None and not _is_autoregressive(policy):
        raise AccheadError(
            f"policy {_spec(policy)!r} needs a draft: pass draft=DRAFT to generate (a custom_generate "
            "callable never receives assistant_model)"
        )
    prompt_len = input_ids.shape[1]
    max_length, eos, others = split_criteria(stopping_criteria)
    max_length = generation_config.max_length if max_length is None else max_length
    # generate's loop checks its criteria after each token, so it always makes at least one.
    max_new_tokens = max(1, max_length - prompt_len)
    built = isinstance(policy, StopPolicy)  # a built policy already holds its head
    if head is None and draft is not None and not built and _typed(policy).needs_head:
        head = pair_head_default(draft, sampling)
    if seed is None:  # as transformers' sampling: repeatable under torch.manual_seed; greedy draws nothing
        seed = 0 if sampling.greedy else int(torch.randint(0, 2**62, ()).item())
    mask = model_kwargs.get("attention_mask")
    if needs_batch(input_ids, mask):
        if stream_to is not None:
            raise AccheadError("a streamer takes one sequence: stream a batch of one unpadded prompt")
        prompts = ragged_prompts(input_ids, mask)
        device = input_ids.device
        checks = [stop_check(others, p[None].to(device), max_new_tokens) for p in prompts] if others else None
        rule = isinstance(_typed(policy), SpecDecPPSpec) if batch_stop is None else batch_stop
        batched = decoder_for(model, draft, policy, head, verifier, fast, copy_rounds, rule)
        sequences, batch = generate_batch(batched, input_ids, prompts, generation_config, sampling,
                                          max_new_tokens=max_new_tokens, eos=eos,
                                          stop_checks=checks, seed=seed)  # fmt: skip
        return _batch_output(sequences, batch) if generation_config.return_dict_in_generate else sequences
    decoder = decoder_for(model, draft, policy, head, verifier, fast, copy_rounds)
    res = decoder.generate(
        input_ids,
        max_new_tokens=max_new_tokens,
        temperature=sampling.temperature,
        top_k=sampling.top_k,
        top_p=sampling.top_p,
        seed=seed,
        eos_token_id=eos or None,
        streamer=stream_to,
        stop_check=stop_check(others, input_ids, max_new_tokens) if others else None,
    )
    sequences = torch.cat([input_ids, res.new_ids.to(input_ids.device)[None]], dim=1)
    if generation_config.return_dict_in_generate:
        return _output(sequences, res)
    return sequences


def custom_generate_dir() -> str:
    """The directory to pass as `custom_generate=` (with `trust_remote_code=True`): it holds
    `custom_generate/generate.py`, which runs `run_directory_form`. A str, because `generate` takes only a
    str for a directory (a `Path` is neither str nor callable, and `generate` would silently ignore it)."""
    return str(Path(__file__).resolve().parent / "hf_custom_generate")


def run_directory_form(
    model: PreTrainedModel,
    inputs: torch.Tensor | None = None,
    generation_config: GenerationConfig | None = None,
    stopping_criteria: StoppingCriteriaList | None = None,
    **kwargs: Any,
) -> torch.Tensor | SpeculativeGenerateOutput:
    """The directory form: `generate` hands a `custom_generate` directory all its arguments unprepared.

    What would be lost on the way to the callable is handed on here: `assistant_model` as `draft`,
    `streamer` as `stream_to`, and `stop_strings` (from the call or the given `generation_config`) with the
    tokenizer as a `StopStringCriteria`; then `generate` runs again with `generate` above as its loop.
    """
    tokenizer = kwargs.pop("tokenizer", None)
    draft, stream_to = kwargs.pop("assistant_model", None), kwargs.pop("streamer", None)
    if kwargs.get("assistant_tokenizer") is not None:
        raise AccheadError("assistant_tokenizer is not supported: the draft must use the target's tokenizer")
    stop_strings = kwargs.pop("stop_strings", None)
    if stop_strings is None and generation_config is not None and generation_config.stop_strings is not None:
        generation_config = copy.deepcopy(generation_config)
        stop_strings, generation_config.stop_strings = generation_config.stop_strings, None
    if model.generation_config.stop_strings is not None:
        # generate refills a missing value from the model's config, so it cannot be taken out here
        raise AccheadError(
            "the model's generation_config sets stop_strings: set model.generation_config.stop_strings = "
            "None and pass stop_strings=... to generate"
        )
    if stop_strings is not None:
        if tokenizer is None:
            raise AccheadError("stop_strings need the tokenizer: pass tokenizer=... to generate")
        stop = StopStringCriteria(tokenizer=tokenizer, stop_strings=stop_strings)
        stopping_criteria = StoppingCriteriaList([*(stopping_criteria or []), stop])
    # The class's generate: a model loaded with trust_remote_code may have its own `generate` attribute.
    return type(model).generate(
        model, inputs, generation_config=generation_config, stopping_criteria=stopping_criteria,
        custom_generate=generate, draft=draft, stream_to=stream_to, **kwargs,
    )  # fmt: skip


def _from_spec(
    spec: DecodingSpec | str, sampling: SamplingConfig, policy: Any, verifier: Any, fast: Any, head: Any
) -> tuple[PolicySpec, str, bool | None, str | None, CopySpec | None]:
    """(policy, verifier, fast, head, copy rounds) of a `DecodingSpec` (`spec_arguments`: one line if the
    four are passed too, or the spec names a model-free drafter); one line if its S is not the generation
    config's."""
    spec, rounds = split_copy_rounds(spec)
    if spec.sampling is not None and spec.sampling != sampling:
        raise AccheadError(f"spec's sampling {spec.sampling} differs from the generation config's {sampling}")
    policy, head, verifier, fast = spec_arguments(spec, policy, head, verifier, fast)
    return policy, verifier, fast, head, rounds


def _typed(policy: str | PolicySpec | StopPolicy) -> PolicySpec:
    """The policy's typed spec (a built policy's resolved one)."""
    return policy.config if isinstance(policy, StopPolicy) else as_policy_spec(policy)


def _is_autoregressive(policy: str | PolicySpec | StopPolicy) -> bool:
    return isinstance(_typed(policy), AutoregressiveSpec)


def _spec(policy: str | PolicySpec | StopPolicy) -> str:
    return _typed(policy).to_spec()


def _batch_output(sequences: torch.Tensor, res: BatchResult) -> SpeculativeGenerateOutput:
    """A batch's output: its batched forwards and summed counts; no per-round lists (rows differ)."""
    return SpeculativeGenerateOutput(
        sequences=sequences, target_calls=res.target_calls, draft_calls=res.draft_calls,
        drafted=sum(r.drafted for r in res.rows), discarded=sum(r.discarded for r in res.rows),
        rounds=res.target_calls, head_calls=res.head_calls,
    )  # fmt: skip


def _output(sequences: torch.Tensor, res: GenerationResult) -> SpeculativeGenerateOutput:
    return SpeculativeGenerateOutput(
        sequences=sequences,
        target_calls=res.target_calls,
        draft_calls=res.draft_calls,
        drafted=res.drafted,
        discarded=res.discarded,
        rounds=res.rounds,
        head_calls=res.head_calls,
        accepted_per_round=list(res.accepted_per_round),
        drafted_per_round=list(res.drafted_per_round),
    )
