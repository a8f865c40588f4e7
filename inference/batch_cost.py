"""The batch stop rule's cost ratio c(B), measured through the batched decoder itself (docs/batched.md).

The batch rule (`acchead.inference.batch_stop`) continues drafting while Σ_{b drafting} P̂_b > c(B)·B. Its
c(B) is the price of one more candidate for the whole batch in units of a row's autoregressive token:

    c(B) = t_step(B) / t_round(B)

- t_step(B): what one more candidate per round adds to a round of B rows: one draft forward of the batch,
  and one more position in the target's verification (the batch is verified in one forward padded to its
  longest row, so a step that lengthens the longest row widens it for every row), with the decoder's own
  bookkeeping around both. On a GPU a small target's verification is memory-bound and the widening is
  nearly free -- the paper's c = t_draft / t_target. On a CPU, or at a large B, the forward is
  compute-bound and the widening costs nearly a whole target step, which a declared c = 1 − h leaves out
  (docs/batched.md measured c = 1 − h = 0.2 far too small on the CPU);
- t_round(B): an autoregressive round of B rows (one target forward), whose B tokens set the worth of an
  accepted token, t_round(B) / B.

`measure_batch_costs` times whole rounds of the batched decoder on random prompts: t_step is a round of
fixed K = 2 minus a round of K = 1 (one more draft forward, one more verified position), t_round an
autoregressive round; the three decoders take turns, and medians of the repeats are kept. Timing bare
forwards instead (an earlier version) read c ≈ 0.05 for the demo pair at B = 1, where the decoder's draft
step costs 1.5x its bare forward (docs/speed.md): the Python around a tiny model's step is part of its price.
`BatchCosts.c_at(B)` interpolates between the measured sizes in log B (clamped at the ends), since rows
that finish leave the batch and B shrinks as it decodes. A measured c is a timing, so two runs may stop
rounds differently: each output stays an exact sample of the target (the rule reads only the past), but
for repeatable sampled runs pass a measured table back (`BatchStop(costs=...)`) or declare c.
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from acchead.errors import AccheadError


@dataclass(frozen=True)
class BatchCost:
    """Median seconds, at `batch` rows, of one more candidate per round and of an autoregressive round."""

    batch: int
    step_s: float  # a fixed-K round of K = 2 minus one of K = 1 (>= 0)
    round_s: float  # an autoregressive round (one target forward of one token per row)

    @property
    def c(self) -> float:
        """c(B) = t_step / t_round."""
        return self.step_s / self.round_s


@dataclass(frozen=True)
class BatchCosts:
    """c(B) from measured batch sizes (at least one, distinct), interpolated in log B between them."""

    costs: tuple[BatchCost, ...]

    def __post_init__(self) -> None:
        sizes = [c.batch for c in self.costs]
        if not sizes or len(set(sizes)) != len(sizes) or min(sizes) < 1:
            raise AccheadError(f"batch costs need distinct batch sizes >= 1, got {sizes}")
        for cost in self.costs:
            if not (cost.round_s > 0 and cost.step_s >= 0):
                raise AccheadError(f"batch costs need round_s > 0 and step_s >= 0 seconds, got {cost}")
        object.__setattr__(self, "costs", tuple(sorted(self.costs, key=lambda c: c.batch)))

    def c_at(self, batch: int) -> float:
        """c at `batch` rows: the measured size's c, or linear in log B between the two around it."""
        points = [(math.log(c.batch), c.c) for c in self.costs]
        x = math.log(max(batch, 1))
        if x <= points[0][0]:
            return points[0][1]
        for (x0, c0), (x1, c1) in itertools.pairwise(points):
            if x <= x1:
                return c0 + (c1 - c0) * (x - x0) / (x1 - x0)
        return points[-1][1]

    def __str__(self) -> str:
        return ",".join(f"B{c.batch}:c={c.c:.3g}" for c in self.costs)


def calibration_sizes(batch: int) -> list[int]:
    """The sizes measured for a batch of `batch` rows: 1, every 4th power below it, and `batch` itself
    (a batch shrinks as its rows finish)."""
    sizes, b = [], 1
    while b < batch:
        sizes.append(b)
        b *= 4
    return [*sizes, batch]


class RoundTimer(Protocol):
    """What `measure_batch_costs` needs of a batched decoder (`BatchedDecoder.generate` and its result)."""

    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float) -> Any: ...


def measure_batch_costs(
    decoders: dict[str, RoundTimer], vocab_size: int, sizes: list[int], rounds: int = 8, repeats: int = 2,
    prompt_len: int = 4, seed: int = 0,
) -> BatchCosts:  # fmt: skip
    """Time the rounds of `decoders` -- "ar", "k1" and "k2": batched decoders of one target and draft with
    the policies autoregressive, specdec:k=1 and specdec:k=2 -- at each batch size in `sizes`: greedy decodes
    of `rounds` tokens per row from random `prompt_len`-token prompts (ids below `vocab_size`), the three
    taking turns, one warm-up turn and `repeats` timed ones; per decode its wall time over its rounds."""
    if rounds < 1 or repeats < 1 or prompt_len < 1:
        raise AccheadError(f"need rounds, repeats and prompt_len >= 1, got {rounds}, {repeats}, {prompt_len}")
    if set(decoders) != {"ar", "k1", "k2"}:
        raise AccheadError(f"measure_batch_costs times decoders ar, k1 and k2, got {sorted(decoders)}")
    g = torch.Generator().manual_seed(seed)
    costs = []
    for b in sizes:
        prompts = torch.randint(1, vocab_size, (b, prompt_len), generator=g).tolist()
        per_round: dict[str, list[float]] = {k: [] for k in decoders}
        for turn in range(repeats + 1):
            for name, dec in decoders.items():
                res = dec.generate(prompts, max_new_tokens=rounds, temperature=0.0)
                if turn:  # the first turn warms up (allocations, first-call dispatch)
                    per_round[name].append(res.wall_time / res.target_calls)
        med = {k: statistics.median(v) for k, v in per_round.items()}
        costs.append(BatchCost(batch=b, step_s=max(med["k2"] - med["k1"], 0.0), round_s=med["ar"]))
    return BatchCosts(tuple(costs))
