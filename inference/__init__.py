"""Speculative decoders (token/block verification; fixed-K, SpecDec++, confidence, oracle) and the bench."""

from acchead.inference.decoder import GenerationResult, SpeculativeDecoder
from acchead.inference.drafters import Drafter, DraftStep, ModelDrafter
from acchead.inference.policies import StopPolicy, parse_policy

__all__ = ["DraftStep", "Drafter", "GenerationResult", "ModelDrafter", "SpeculativeDecoder", "StopPolicy",
           "parse_policy"]
