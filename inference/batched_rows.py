"""One row of a batched decode (`acchead.inference.batched.BatchedDecoder`): its committed ids on the host,
its limits, its statistics, and what a verified round commits to it.

A row ends at an accepted EOS, at its stop check (how stop strings end a row: it returns how many of the
row's new tokens to keep) or at its max new tokens; the commit after each round applies them in that order,
as `SpeculativeDecoder.generate` does for one prompt. A policy with per-decode state (AdaEDL's online λ)
keeps it in the row's `run`, advanced after each of the row's rounds, so every row adapts to its own
acceptance exactly as it would decoded alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from acchead.inference.policies import PolicyRun
from acchead.inference.results import GenerationResult


@dataclass
class Row:
    """One prompt's decoding state: committed ids (prompt + generated) on the host.

    Attributes:
        ids: the prompt and every token committed so far. prompt_len, max_new, seed: as given.
        stop_check: called with the row's new tokens of a round; how many to keep when the row must end.
        res: the row's counts and, at the end, its new ids. done: the row has ended (it leaves the batch).
        run: the policy's per-decode state for this row (None: a stateless policy).
    """

    ids: list[int]
    prompt_len: int
    max_new: int
    seed: int
    stop_check: Callable[[list[int]], int | None] | None
    res: GenerationResult = field(default_factory=lambda: GenerationResult(torch.empty(0, dtype=torch.long)))
    done: bool = False
    run: PolicyRun | None = None

    @property
    def generated(self) -> int:
        return len(self.ids) - self.prompt_len

    def commit(self, cands: list[int], tau: int, nxt: int, eos: set[int], draft_calls: int) -> None:
        """Commit a verified round: the first `tau` candidates and the token `nxt`, cut at an EOS or by the
        stop check; the round's counts (its `draft_calls` batched draft forwards, every row's); the policy
        run's update from (drafted, accepted)."""
        new = [*cands[:tau], nxt]
        cut = next((i for i, t in enumerate(new) if t in eos), None)
        if cut is not None:
            new, self.done = new[: cut + 1], True
        if self.stop_check is not None and (keep_n := self.stop_check(new)) is not None:
            new, self.done = new[:keep_n], True
        self.ids += new
        num, res = len(cands), self.res
        res.rounds += 1
        res.draft_calls += draft_calls
        res.drafted += num
        res.discarded += num - tau
        res.accepted_per_round.append(tau)
        res.drafted_per_round.append(num)
        if self.run is not None:
            self.run.end_round(num, tau)
        self.done = self.done or self.generated >= self.max_new
