"""A batch of one prompt: `BatchedDecoder` decodes it with the single-prompt decoder.

Why. At B = 1 the batched rounds ran 0.92-0.96x the single-prompt `SpeculativeDecoder` on the CPU fast path,
the two timed in turns in one bench (docs/batched.md, "B = 1 interleaved"): the batched forwards read a
(B, capacity) validity mask and a round's bookkeeping is per row, while the single-prompt path runs each
draft step, its head and stop test as one compiled unit over a plain static cache. Both decode the same
algorithm with the same random keys (row b draws with seed_b, as `SpeculativeDecoder.generate(prompt_b,
seed=seed_b)` does), so a batch of one loses nothing by taking the faster path: the same tokens, sooner.

The batch rule at B = 1 (`acchead.inference.batch_stop`) stops the one row once P̂ ≤ c(1), on top of the
row's own threshold (stop once P̂ < 1 − h): together one threshold h' with 1 − h' = max(1 − h, c(1)), which
the single-prompt decoder runs (the two differ only when P̂ equals c(1) exactly). Its stops are then not
told apart from the row's own: `BatchResult.batch_stops` counts none at B = 1. A measured c(1) is timed
on the single-prompt decoder's rounds (`SingleRow.timer`: the path that runs it); where it is 1 or more
(a draft step dearer than a whole autoregressive round: tiny models), the rule ends every round at its
first judged candidate, and so does h' = `H_MIN` unless the head's logit for it exceeds ~20.7
(log σ(f) ≥ −1e-9).
"""

from __future__ import annotations

import time

import torch
from transformers import PreTrainedModel

from acchead.inference.batch_stop import BatchStop
from acchead.inference.batched_rows import Row
from acchead.inference.decoder import SpeculativeDecoder
from acchead.inference.device_path import DevicePath
from acchead.inference.drafter_spec import CopySpec
from acchead.inference.policies import StopPolicy
from acchead.inference.results import BatchResult
from acchead.inference.specdecpp_policy import SpecDecPP

H_MIN = 1e-9  # h' where c(1) >= 1: stop at every judged candidate (SpecDec++ takes 0 < h < 1)


def single_threshold(policy: SpecDecPP, rule: BatchStop | None) -> float:
    """h' of a batch of one under the batch rule: 1 − h' = max(1 − h, c(1)) (the module docstring)."""
    if rule is None:
        return policy.h
    return max(min(policy.h, 1.0 - rule.ratio(1)), H_MIN)


class SingleRow:
    """The single-prompt decoders a `BatchedDecoder` runs its batches of one on: one per threshold h' (the
    batch rule's c(1) may move it), built on first use; on the fast path they share their models' runners
    (`acchead.inference.model_runner.make_runner`), but a new policy object's draft units compile again
    (~3 s for the toy pair from Inductor's cache): `BatchedDecoder.warm_up` builds the one at h' first.

    Args: the `BatchedDecoder`'s models, its parsed policy, verifier and path (`fast`, `compile`,
    `device_path`, as `SpeculativeDecoder` takes them); `copy`: its copy rounds; `profile`: time each round
    (`round_times`: the batch rule's timers, `BatchedDecoder.calibrate`, price c(1) on the rounds a batch of
    one runs).
    """

    def __init__(
        self,
        target: PreTrainedModel,
        draft: PreTrainedModel | None,
        policy: StopPolicy,
        verifier: str,
        fast: bool,
        compile: bool,
        device_path: bool | DevicePath | None,
        copy: CopySpec | None = None,
        profile: bool = False,
    ) -> None:
        self.target, self.draft, self.policy, self.verifier = target, draft, policy, verifier
        self.copy = copy
        self.fast, self.compile, self.device_path, self.profile = fast, compile, device_path, profile
        self._decoders: dict[float | None, SpeculativeDecoder] = {}

    def timer(self, draft: PreTrainedModel | None, policy: StopPolicy) -> SingleRow:
        """A profiling twin on this target and path for `draft` and `policy` (a batch rule's timer)."""
        return SingleRow(self.target, draft, policy, "token", self.fast, self.compile, self.device_path,
                         profile=True)  # fmt: skip

    def decoder(self, rule: BatchStop | None) -> SpeculativeDecoder:
        """The single-prompt decoder of this policy under the batch rule `rule` at B = 1."""
        pp = self.policy if isinstance(self.policy, SpecDecPP) else None
        h = single_threshold(pp, rule) if pp is not None else None
        if h not in self._decoders:
            policy = self.policy
            if pp is not None and h != pp.h:  # the same head, cap and free token at h'
                policy = SpecDecPP(pp.head, h, pp.max_draft, pp.free_token)
            self._decoders[h] = SpeculativeDecoder(
                self.target, self.draft, policy, verifier=self.verifier, fast=self.fast,
                compile=self.compile, device_path=self.device_path, copy=self.copy,
            )  # fmt: skip
        return self._decoders[h]

    def warm_up(
        self, rule: BatchStop | None, length: int, temperature: float, top_k: int, top_p: float
    ) -> None:
        """Compile the single-prompt decoder's units for decodes of up to `length` tokens under this S (the
        units do not depend on h: a threshold is an input of their graphs)."""
        self.decoder(rule).warm_up(length, temperature, top_k, top_p)

    def generate(
        self,
        row: Row,
        rule: BatchStop | None,
        temperature: float,
        top_k: int,
        top_p: float,
        eos_token_id: int | list[int] | None,
    ) -> BatchResult:
        """Decode the batch's one row (`make_rows` checked it) as `BatchedDecoder.generate` would: its tokens
        and counts; the batch's forwards are the row's."""
        start = time.perf_counter()
        res = self.decoder(rule).generate(
            torch.tensor(row.ids, dtype=torch.long), max_new_tokens=row.max_new, temperature=temperature,
            top_k=top_k, top_p=top_p, seed=row.seed, eos_token_id=eos_token_id, stop_check=row.stop_check,
            profile=self.profile,
        )  # fmt: skip
        out = BatchResult(rows=[res], target_calls=res.target_calls, draft_calls=res.draft_calls,
                          head_calls=res.head_calls)  # fmt: skip
        if self.profile:  # a round: its drafting and its verification (with both rollbacks)
            ms = zip(res.phases["draft_ms"], res.phases["verify_ms"], strict=True)
            out.round_times = [(d + v) / 1e3 for d, v in ms]
            out.round_draft_calls = [int(n) for n in res.phases["draft_forwards"]]
        out.wall_time = time.perf_counter() - start
        return out
