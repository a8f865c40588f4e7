"""Which decoder and which default head transformers' `generate` integration (`acchead.inference.hf`) uses.

`generate(..., custom_generate=hf.generate)` is called once per prompt or batch, and building a decoder per
call would rebuild its policy and, on the fast path, recompile its units. So the integration reuses one
`SpeculativeDecoder` per (target, draft, policy, head, verifier, fast, copy rounds), and for a batch
(`acchead.inference.hf_batched`) one `BatchedDecoder` per those and its batch stop rule. These objects are
owned here, not stored on the models:

- `DecoderCache` keeps the most recently used decoders (8 by default, `DECODERS`). A decoder holds its
  target and draft, so a cache keyed weakly by the model (`weakref.WeakKeyDictionary`) would never let
  them go: its values would keep its keys alive. Bounded instead, and released explicitly: `release(model)`
  drops every decoder of a model (as target or draft), `clear()` all of them.
- `pair_head_default` looks up a named pair's shipped head once per (draft, S), in a
  `WeakKeyDictionary` keyed by the draft: its values are paths, which hold no model, so an entry goes
  with its draft.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING

from transformers import PreTrainedModel

from acchead.head import AcceptanceHead
from acchead.inference.batched import BatchedDecoder
from acchead.inference.decoder import SpeculativeDecoder
from acchead.inference.drafter_spec import CopySpec
from acchead.pairs import shipped_head_for
from acchead.sampling import SamplingConfig

if TYPE_CHECKING:
    from acchead.inference.batch_stop import BatchStop
    from acchead.inference.policies import StopPolicy
    from acchead.inference.policy_spec import PolicySpec

# How many decoders `DECODERS` keeps: more than one caller's (policy, S) settings of a session.
DEFAULT_CACHED_DECODERS = 8


class DecoderCache:
    """The decoders `generate` reuses, least recently used dropped first.

    Args:
        size: the most decoders kept (each holds its models, its policy and, on the fast path, its
            compiled units).
    """

    def __init__(self, size: int = DEFAULT_CACHED_DECODERS) -> None:
        if size < 1:
            raise ValueError(f"a decoder cache holds at least one decoder, got size={size}")
        self.size = size
        self._decoders: OrderedDict[tuple, SpeculativeDecoder | BatchedDecoder] = OrderedDict()

    def get(
        self,
        target: PreTrainedModel,
        draft: PreTrainedModel | None,
        policy: str | PolicySpec | StopPolicy,
        head: AcceptanceHead | str | Path | None,
        verifier: str,
        fast: bool | None,
        copy: CopySpec | None = None,
        batch_stop: bool | float | str | BatchStop | None = None,
    ) -> SpeculativeDecoder | BatchedDecoder:
        """The decoder for these arguments: the cached one, or a new one (which may evict the least
        recently used); with `batch_stop` (False included) a `BatchedDecoder` under that batch rule, else a
        `SpeculativeDecoder`. A head file is keyed by its resolved path; models and objects by identity."""
        head_key = str(Path(head).expanduser().resolve()) if isinstance(head, str | Path) else head
        kind = "single" if batch_stop is None else ("batched", batch_stop)
        key = (target, draft, policy, head_key, verifier, fast, copy, kind)
        decoder = self._decoders.get(key)
        if decoder is None:
            if batch_stop is None:
                decoder = SpeculativeDecoder(target, draft, policy, head, verifier, fast, copy=copy)
            else:
                decoder = BatchedDecoder(target, draft, policy, head, verifier, batch_stop, fast=fast,
                                         copy=copy)  # fmt: skip
            self._decoders[key] = decoder
            while len(self._decoders) > self.size:
                self._decoders.popitem(last=False)
        self._decoders.move_to_end(key)
        return decoder

    def decoders(self, model: PreTrainedModel) -> list[SpeculativeDecoder | BatchedDecoder]:
        """The cached decoders that use `model` as target or draft, least recently used first."""
        return [d for key, d in self._decoders.items() if model is key[0] or model is key[1]]

    def release(self, model: PreTrainedModel) -> None:
        """Drop every decoder that uses `model` (as target or draft), so that it can be freed."""
        for key in [k for k in self._decoders if model is k[0] or model is k[1]]:
            del self._decoders[key]

    def clear(self) -> None:
        """Drop every decoder."""
        self._decoders.clear()

    def __len__(self) -> int:
        return len(self._decoders)


DECODERS = DecoderCache()

# Per draft model, the shipped head by S (None: the draft is no named pair's).
_PAIR_HEADS: weakref.WeakKeyDictionary[PreTrainedModel, dict[SamplingConfig, Path | None]] = (
    weakref.WeakKeyDictionary()
)


def decoder_for(
    target: PreTrainedModel,
    draft: PreTrainedModel | None,
    policy: str | PolicySpec | StopPolicy,
    head: AcceptanceHead | str | Path | None,
    verifier: str,
    fast: bool | None,
    copy: CopySpec | None = None,
    batch_stop: bool | float | str | BatchStop | None = None,
) -> SpeculativeDecoder | BatchedDecoder:
    """The decoder `generate` uses for these arguments (`copy`: copy rounds), from `DECODERS`: a
    `SpeculativeDecoder`, or with `batch_stop` (False included) the `BatchedDecoder` of a batch
    (`acchead.inference.hf_batched`). An adaptive policy carrying state between calls, a round gate's memory
    and a measured c(B) see them as calls of one decoder."""
    return DECODERS.get(target, draft, policy, head, verifier, fast, copy, batch_stop)


def pair_head_default(draft: PreTrainedModel, sampling: SamplingConfig) -> Path | None:
    """The head `generate` uses when given none: a named pair's shipped head for S when `draft` is that
    pair's draft (`acchead.pairs.shipped_head_for`), else None (the decoder then asks for `head=`).

    Resolved at the integration's entry, because the decoder never picks a head. Looked up once per
    (draft, S): the draft check reads the draft's embedding, which would otherwise cost every call a
    device read.
    """
    heads = _PAIR_HEADS.setdefault(draft, {})
    if sampling not in heads:
        heads[sampling] = shipped_head_for(draft, sampling)
    return heads[sampling]


def pair_heads(draft: PreTrainedModel) -> dict[SamplingConfig, Path | None]:
    """The heads `pair_head_default` has looked up for `draft`, by S (a copy)."""
    return dict(_PAIR_HEADS.get(draft, {}))
