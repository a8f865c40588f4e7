"""Speculative decoders (token/block verification; fixed-K, SpecDec++, confidence, oracle, bandits).

The decoding loop is `decoder`, its stop policies `policies` (bandits: `bandit`, `bandit_policy`), its
drafters `drafters`, `mag` and `cascade`, its verifiers `verification`; `cli_decode` is `acchead-decode`.
The benchmark that measures them, `acchead-bench`, is the subpackage `acchead.inference.bench`.
"""

# bandit_policy also registers the ucb:/exp3: specs with parse_policy (see policies.COMPOSITE_PARSERS).
from acchead.inference.bandit_policy import BanditPolicy
from acchead.inference.decoder import GenerationResult, SpeculativeDecoder, bandit_decoder
from acchead.inference.drafters import Drafter, DraftStep, ModelDrafter
from acchead.inference.policies import StopPolicy, parse_policy

__all__ = ["BanditPolicy", "DraftStep", "Drafter", "GenerationResult", "ModelDrafter", "SpeculativeDecoder",
           "StopPolicy", "bandit_decoder", "parse_policy"]
