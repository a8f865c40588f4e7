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

`measure_batch_costs` times the rounds of the batched decoder on random prompts (`BatchResult.round_times`):
t_step is the slope of a round's seconds over its draft forwards, fitted through the rounds of fixed K = 1,
2 and 3 (a round drafting one candidate more costs a draft forward and a verified position more), t_round
an autoregressive round, and t_first (what a round's first draft forward adds: `BatchCost.first_s`) the
fastest K = 1 round less the autoregressive one; the round gate prices a round by the timed rounds of its
forwards themselves (`BatchCost.drafted_s`: a verification's graphs of 2, 3 and 4 positions need not cost
a line, measured below); the four decoders take turns,
each decode's first round (the prefill) is left out, and so is every round after a row finished (eager
rows leave the batch, and a round of fewer rows is cheaper: until the twenty-fifth session the real pair's
c(64) read 2.89 so, its autoregressive "round" 60 ms against 280 ms with all 64 rows), and per draft count
the fastest round is kept (a busy machine only ever slows a round down). Two
earlier versions did worse on a box shared with a training run: bare forwards read c ≈ 0.05 for the demo
pair at B = 1, where the decoder's draft step costs 1.5x its bare forward (docs/speed.md: the Python around
a tiny model's step is part of its price); medians of whole decodes (K = 2 minus K = 1, prefill and capped
last rounds included) read c from 0 to 1.06 at B = 1.
`BatchCosts.c_at(B)` interpolates between the measured sizes in log B (clamped at the ends), since rows
that finish leave the batch and B shrinks as it decodes. A measured c is a timing, so two runs may stop
rounds differently: each output stays an exact sample of the target (the rule reads only the past), but
for repeatable sampled runs pass a measured table back (`BatchStop(costs=...)`) or declare c.
"""

from __future__ import annotations

import itertools
import math
import weakref
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from acchead.errors import AccheadError


@dataclass(frozen=True)
class BatchCost:
    """Seconds, at `batch` rows, of one more candidate per round and of an autoregressive round (fastest
    rounds, `measure_batch_costs`)."""

    batch: int
    step_s: float  # a round's seconds per draft forward more (fitted over rounds of K = 1, 2 and 3), >= 0
    round_s: float  # an autoregressive round (one target forward of one token per row)
    # what drafting at all adds to a round: its fastest round of one draft forward (K = 1) less the
    # autoregressive round, >= 0 (the round gate's price, `acchead.inference.round_gate`); None: step_s
    first_s: float | None = None
    # the fastest rounds of 1, 2, ... draft forwards as timed (K = 1, 2, 3): a round's price need not be a
    # line in its forwards (on the toy pair's CPU fast path at B = 64 a round of 2 cost 1.75 autoregressive
    # rounds, the line through those of 1 and 3 said 1.62); () prices every round by the line
    drafted_s: tuple[float, ...] = ()

    @property
    def c(self) -> float:
        """c(B) = t_step / t_round."""
        return self.step_s / self.round_s

    @property
    def c_first(self) -> float:
        """c₁(B) = t_first / t_round: a round's first draft forward, the dearer one where drafting has a
        fixed price of its own (the draft's catch-up feed, the verification's second position)."""
        return (self.step_s if self.first_s is None else self.first_s) / self.round_s

    def round_ratio(self, forwards: float) -> float:
        """A round of `forwards` (>= 1, a mean may be fractional) draft forwards over an autoregressive round:
        the timed rounds' ratios, linear between them and by c past the last; without them
        1 + c₁ + (forwards − 1)·c."""
        if not self.drafted_s:
            return 1.0 + self.c_first + (forwards - 1.0) * self.c
        ratios = [t / self.round_s for t in self.drafted_s]  # forwards 1, 2, ...
        last = len(ratios)
        if forwards >= last:
            return ratios[-1] + (forwards - last) * self.c
        lo = max(math.floor(forwards), 1)
        return ratios[lo - 1] + (ratios[lo] - ratios[lo - 1]) * (max(forwards, 1.0) - lo)


@dataclass(frozen=True)
class BatchCosts:
    """c(B) from measured batch sizes (at least one, distinct), interpolated in log B between them."""

    costs: tuple[BatchCost, ...]

    def __post_init__(self) -> None:
        sizes = [c.batch for c in self.costs]
        if not sizes or len(set(sizes)) != len(sizes) or min(sizes) < 1:
            raise AccheadError(f"batch costs need distinct batch sizes >= 1, got {sizes}")
        for cost in self.costs:
            if not (cost.round_s > 0 and cost.step_s >= 0 and (cost.first_s or 0.0) >= 0
                    and all(t > 0 for t in cost.drafted_s)):  # fmt: skip
                raise AccheadError("batch costs need round_s > 0, step_s >= 0, first_s >= 0 and drafted_s > 0"
                                   f" seconds, got {cost}")
        object.__setattr__(self, "costs", tuple(sorted(self.costs, key=lambda c: c.batch)))

    def c_at(self, batch: int) -> float:
        """c at `batch` rows: the measured size's c, or linear in log B between the two around it."""
        return self._at(batch, [c.c for c in self.costs])

    def c_first_at(self, batch: int) -> float:
        """c₁ (`BatchCost.c_first`) at `batch` rows, interpolated as `c_at`."""
        return self._at(batch, [c.c_first for c in self.costs])

    def round_s_at(self, batch: int) -> float:
        """An autoregressive round's seconds at `batch` rows, interpolated as `c_at`."""
        return self._at(batch, [c.round_s for c in self.costs])

    def round_ratio_at(self, batch: int, forwards: float) -> float:
        """`BatchCost.round_ratio` at `batch` rows, interpolated as `c_at`."""
        return self._at(batch, [c.round_ratio(forwards) for c in self.costs])

    def _at(self, batch: int, values: list[float]) -> float:
        """`values` (one per measured size) at `batch` rows: linear in log B, clamped at the ends."""
        points = [(math.log(c.batch), v) for c, v in zip(self.costs, values, strict=True)]
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


# target -> draft -> path ("fast" / "eager") -> {B: BatchCost}: the sizes measured in this process
_MEASURED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def measured_costs(target: torch.nn.Module, draft: torch.nn.Module, path: str) -> dict[int, BatchCost]:
    """The costs measured so far in this process for this target and draft on `path`, by batch size, to
    read and add to: every measured rule of one pair and path shares them, so two decoders of the pair (the
    bench's two heads) stop by the same c(B) instead of two timings' noise, and each size is timed once.
    Held by the models' lifetimes (weak keys)."""
    by_draft = _MEASURED.setdefault(target, weakref.WeakKeyDictionary())
    return by_draft.setdefault(draft, {}).setdefault(path, {})


class RoundTimer(Protocol):
    """What `measure_batch_costs` needs of a batched decoder: `BatchedDecoder.generate`, whose result has
    `round_times`, `round_draft_calls` and `round_rows`."""

    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float) -> Any: ...


def measure_batch_costs(
    decoders: dict[str, RoundTimer], vocab_size: int, sizes: list[int], rounds: int = 12, repeats: int = 5,
    prompt_len: int = 4, seed: int = 0,
) -> BatchCosts:  # fmt: skip
    """Time the rounds of `decoders` -- "ar", "k1", "k2" and "k3": batched decoders of one target and draft
    with the policies autoregressive and specdec:k=1, 2 and 3, built with `single=False` (a batch of one
    dispatched to the single-prompt decoder keeps no round times) -- at each batch size in `sizes`: greedy
    decodes of `rounds` tokens per row from random `prompt_len`-token prompts (ids below `vocab_size`), the
    four taking turns, one warm-up turn and `repeats` timed ones (see the module docstring for the fit)."""
    if rounds < 2 or repeats < 1 or prompt_len < 1:
        raise AccheadError(
            f"need rounds >= 2, repeats and prompt_len >= 1, got {rounds}, {repeats}, {prompt_len}"
        )
    if set(decoders) != {"ar", "k1", "k2", "k3"}:
        raise AccheadError(f"measure_batch_costs times decoders ar, k1, k2 and k3, got {sorted(decoders)}")
    g = torch.Generator().manual_seed(seed)
    costs = []
    for b in sizes:
        prompts = torch.randint(1, vocab_size, (b, prompt_len), generator=g).tolist()
        by_drafts: dict[int, list[float]] = {}  # draft forwards in a round -> its seconds
        for turn in range(repeats + 1):
            for dec in decoders.values():
                res = dec.generate(prompts, max_new_tokens=rounds, temperature=0.0)
                if turn:  # the first turn warms up (allocations, first-call dispatch)
                    rounds_of = zip(res.round_draft_calls, res.round_times, res.round_rows, strict=True)
                    for d, t, rows in list(rounds_of)[1:]:
                        if rows == b:  # not a round after rows finished: a narrower batch is cheaper
                            by_drafts.setdefault(d, []).append(t)
        fastest = {d: min(ts) for d, ts in by_drafts.items()}
        if 0 not in fastest or len(fastest) < 3:
            raise AccheadError(
                f"B = {b}: rounds of too few lengths to fit ({sorted(fastest)} draft forwards)"
            )
        xs = [d for d in fastest if d > 0]
        mean_x, mean_y = sum(xs) / len(xs), sum(fastest[d] for d in xs) / len(xs)
        slope = sum((d - mean_x) * (fastest[d] - mean_y) for d in xs) / sum((d - mean_x) ** 2 for d in xs)
        first = max(fastest[1] - fastest[0], 0.0) if 1 in fastest else None
        drafted = tuple(itertools.takewhile(lambda t: t is not None, (fastest.get(d) for d in range(1, 4))))
        costs.append(BatchCost(batch=b, step_s=max(slope, 0.0), round_s=fastest[0], first_s=first,
                               drafted_s=drafted))  # fmt: skip
    return BatchCosts(tuple(costs))
