"""A decoder from its typed configuration (`acchead.inference.spec.DecodingSpec`): the one factory that
`acchead-decode` and the bench build their decoders with.

    decoder = build_decoder(DecodingSpec.from_spec("mag+specdec:k=10"), target, draft, bigram=table)

A spec names a drafter (`DRAFTER+POLICY`: Max-Gram or a cascade, built by
`acchead.inference.cascade.make_drafter`; copy rounds, which the decoder wraps around the draft model's,
`acchead.inference.copy_drafter`), a bandit whose arms name drafters (built by
`acchead.inference.bandit_decoder`), or neither (the draft model drafts). The policy is built from its typed
spec by `SpeculativeDecoder` itself (`acchead.inference.policy_build`), which also checks the head file
against the draft and refuses a `specdecpp` policy without one.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from transformers import PreTrainedModel

from acchead.inference.bandit_decoder import bandit_decoder
from acchead.inference.bandit_spec import BanditSpec
from acchead.inference.cascade import make_drafter
from acchead.inference.decoder import SpeculativeDecoder
from acchead.inference.device_path import DevicePath
from acchead.inference.drafter_spec import CopySpec
from acchead.inference.spec import DecodingSpec


def build_decoder(
    spec: DecodingSpec,
    target: PreTrainedModel,
    draft: PreTrainedModel | None,
    *,
    bigram: Any = None,
    compile: bool = True,
    device_path: bool | DevicePath | None = None,
) -> SpeculativeDecoder:
    """The decoder `spec` describes, over `target` and `draft` (the draft model: it drafts, or reviews a
    cascade's proposals). `bigram`: MaG's table, for `mag` and `cascade` drafters. A `specdecpp` policy
    without `spec.head` is refused by the decoder (one line)."""
    if isinstance(spec.policy, BanditSpec) and spec.policy.has_drafters:
        head = spec.head if spec.needs_head else None
        return bandit_decoder(target, draft, spec.policy, bigram=bigram, head=head, verifier=spec.verifier,
                              fast=spec.fast, device_path=device_path)  # fmt: skip
    drafter: Any = draft
    if spec.drafter is not None and not isinstance(spec.drafter, CopySpec):  # copy rounds: the decoder's
        drafter = make_drafter(spec.drafter, draft=draft, bigram=bigram, vocab_size=target.config.vocab_size)
        spec = replace(spec, drafter=None)
    return SpeculativeDecoder(target, drafter, spec=spec, compile=compile, device_path=device_path)
