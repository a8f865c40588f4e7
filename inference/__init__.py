"""Speculative decoders (token/block verification; fixed-K, SpecDec++, confidence, oracle, bandits).

The decoding loop is `decoder` (a round: `draft_round`, then `round_verifier`; what it returns:
`results`; a bandit's decoder: `bandit_decoder`), its stop policies `policies` (bandits: `bandit`,
`bandit_policy`), its drafters `drafters`, `mag` and `cascade`, its verifiers `verification`; `cli_decode`
is `acchead-decode`. What a decoder decodes with is one typed value, `spec.DecodingSpec` (its policy's
typed spec: `policy_spec`, `bandit_spec`), built by `decoder_factory.build_decoder`;
`hf` runs the decoder as transformers' own `generate` loop (`custom_generate=acchead.inference.hf.generate`;
a left-padded batch as one `BatchedDecoder` batch: `hf_batched`).
`batched` decodes B prompts at once (autoregressive, fixed K, SpecDec++ with a batch stop rule).
The benchmark that measures them, `acchead-bench`, is the subpackage `acchead.inference.bench`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from acchead.inference.bandit_decoder import bandit_decoder
    from acchead.inference.bandit_policy import BanditPolicy
    from acchead.inference.batched import BatchedDecoder
    from acchead.inference.decoder import SpeculativeDecoder
    from acchead.inference.decoder_factory import build_decoder
    from acchead.inference.drafters import Drafter, DraftStep, ModelDrafter
    from acchead.inference.policies import StopPolicy
    from acchead.inference.policy_build import parse_policy
    from acchead.inference.results import GenerationResult
    from acchead.inference.spec import DecodingSpec

__all__ = ["BanditPolicy", "BatchedDecoder", "DecodingSpec", "DraftStep", "Drafter", "GenerationResult",
           "ModelDrafter", "SpeculativeDecoder", "StopPolicy", "bandit_decoder", "build_decoder",
           "parse_policy"]  # fmt: skip


def __getattr__(name: str) -> object:
    """The names above load on first use (PEP 562): importing `acchead.inference.cli_decode` or the bench
    runs this file, and their `--help` must not wait for torch and transformers."""
    if name not in __all__:
        raise AttributeError(f"module 'acchead.inference' has no attribute {name!r}")
    from acchead.inference.bandit_decoder import bandit_decoder
    from acchead.inference.bandit_policy import BanditPolicy
    from acchead.inference.batched import BatchedDecoder
    from acchead.inference.decoder import SpeculativeDecoder
    from acchead.inference.decoder_factory import build_decoder
    from acchead.inference.drafters import Drafter, DraftStep, ModelDrafter
    from acchead.inference.policies import StopPolicy
    from acchead.inference.policy_build import parse_policy
    from acchead.inference.results import GenerationResult
    from acchead.inference.spec import DecodingSpec

    names = {
        "BanditPolicy": BanditPolicy, "BatchedDecoder": BatchedDecoder, "DraftStep": DraftStep,
        "Drafter": Drafter, "GenerationResult": GenerationResult, "ModelDrafter": ModelDrafter,
        "SpeculativeDecoder": SpeculativeDecoder, "StopPolicy": StopPolicy, "bandit_decoder": bandit_decoder,
        "parse_policy": parse_policy, "DecodingSpec": DecodingSpec, "build_decoder": build_decoder,
    }  # fmt: skip
    globals().update(names)
    return names[name]


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
