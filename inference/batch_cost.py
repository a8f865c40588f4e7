"""The batch stop rule's cost ratio c(B), measured on the machine that decodes (docs/batched.md).

The batch rule (`acchead.inference.batch_stop`) continues drafting while Σ_{b drafting} P̂_b > c(B)·B. Its
c(B) is the price of one more draft step of the whole batch in units of a row's autoregressive token:

    c(B) = (t_draft(B) + t_widen(B)) / t_target(B)

- t_draft(B): one draft forward of one token per row (the step itself);
- t_widen(B): what one more position per row adds to the target's verification forward (the batch is
  verified in one forward padded to its longest row, so a step that lengthens the longest row widens it
  for every row). On a GPU a small target's verification is memory-bound and this is near 0 -- the
  paper's c = t_draft / t_target. On a CPU, or at a large B, the forward is compute-bound and this is
  near a whole target step, which the declared c = 1 − h left out (docs/batched.md measured c = 1 − h =
  0.2 far too small on the CPU);
- t_target(B): one target forward of one token per row, what batched autoregressive decoding pays for B
  tokens, so t_target(B) / B is the worth of an accepted token.

`measure_batch_costs` times these forwards at the given batch sizes with `acchead.step_cost.forward_seconds`
(the widths interleaved so a busy machine slows them alike; medians) and `BatchCosts.c_at(B)` interpolates
between the measured sizes in log B (clamped at the ends), since rows that finish leave the batch and B
shrinks as it decodes. A measured c is a timing, so two runs may stop rounds differently: each output stays
an exact sample of the target (the rule reads only the past), but for repeatable sampled runs pass the
measured table back (`BatchStop(costs=...)`) or a declared c.
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass

from acchead.errors import AccheadError


@dataclass(frozen=True)
class BatchCost:
    """Median seconds of the forwards that price one batch draft step at `batch` rows."""

    batch: int
    draft_s: float  # one draft forward, one token per row
    target_s: float  # one target forward, one token per row (an autoregressive step of the batch)
    widen_s: float  # one more position per row in a verification forward of `width` positions (>= 0)
    width: int  # the verification width the widening was measured at

    @property
    def c(self) -> float:
        """c(B) = (t_draft + t_widen) / t_target."""
        return (self.draft_s + self.widen_s) / self.target_s


@dataclass(frozen=True)
class BatchCosts:
    """c(B) from measured batch sizes (at least one, distinct), interpolated in log B between them."""

    costs: tuple[BatchCost, ...]

    def __post_init__(self) -> None:
        sizes = [c.batch for c in self.costs]
        if not sizes or len(set(sizes)) != len(sizes) or min(sizes) < 1:
            raise AccheadError(f"batch costs need distinct batch sizes >= 1, got {sizes}")
        for cost in self.costs:
            if not (cost.target_s > 0 and cost.draft_s > 0 and cost.widen_s >= 0):
                raise AccheadError(f"batch costs must be positive seconds, got {cost}")
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


def measure_batch_costs(
    target, draft, sizes: list[int], context: int = 16, width: int = 3, calls: int = 5
) -> BatchCosts:
    """Time the draft's one-token forward and the target's forwards of 1, `width` and `width + 1` tokens per
    row at each batch size in `sizes`, after a `context`-token prefill of random ids; medians of `calls`
    (after one warm-up call). `width` stands for a typical verification (committed tail + candidates)."""
    from acchead.step_cost import forward_seconds

    if width < 1 or calls < 1 or context < 1:
        raise AccheadError(f"need width, calls and context >= 1, got {width}, {calls}, {context}")
    costs = []
    for b in sizes:
        t = forward_seconds(target, context, calls + 1, widths=(1, width, width + 1), batch=b)
        d = forward_seconds(draft, context, calls + 1, batch=b)
        med = {w: statistics.median(v[1:]) for w, v in t.items()}
        costs.append(BatchCost(
            batch=b, draft_s=statistics.median(d[1][1:]), target_s=med[1],
            widen_s=max(med[width + 1] - med[width], 0.0), width=width,
        ))  # fmt: skip
    return BatchCosts(tuple(costs))
