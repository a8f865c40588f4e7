"""`draft_step`'s stop decisions, hand-computed: under a batch rule a row's own threshold is a vote
(`StepRule.lockstep`), without one each row stops alone (acchead.inference.batched_step)."""

import math

import pytest
import torch

from acchead.inference.batched_step import StepRule, draft_step
from acchead.inference.units import FEED, SAMPLE
from acchead.sampling import SamplingConfig

GREEDY = SamplingConfig(0.0, 0, 1.0)


class StateHead(torch.nn.Module):
    """A stand-in acceptance head: its logit is the state's first coordinate."""

    inputs = ("state",)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (N, H) -> (N,)
        return x[:, 0]


def _step(accept: list[float], judge_at: str, lockstep: bool, bound: float, k: int = 1, h: float = 0.5):
    """One step over rows whose head says P(accept) = `accept` (B,), every row drafting, caps of 5."""
    b = len(accept)
    logit = torch.logit(torch.tensor(accept))
    hidden = torch.stack([logit, torch.zeros(b)], dim=1)[:, None]  # (B, 1, 2)
    logits = torch.zeros(b, 1, 4)  # (B, 1, V)
    rule = StepRule(judge_at, StateHead(), lockstep=lockstep)
    f64 = dict(dtype=torch.float64)
    out = draft_step(
        logits, hidden, None, None, torch.ones(b, dtype=torch.bool), torch.zeros(b, **f64),
        torch.full((b,), 5), torch.zeros(b, dtype=torch.int64), torch.zeros(b, dtype=torch.int64), None,
        torch.tensor(k), torch.tensor(math.log1p(-h), **f64), torch.tensor(bound, **f64), rule, GREEDY,
    )  # fmt: skip
    _, _, take, drafting, log_p, batch_stop, _, _ = out
    return take.tolist(), drafting.tolist(), log_p.exp().tolist(), bool(batch_stop)


@pytest.mark.parametrize("judge_at,k", [(SAMPLE, 1), (FEED, 2)])
def test_a_row_below_its_threshold_drafts_on_while_the_batch_does(judge_at, k):
    accept = [0.9, 0.1, 0.3]  # h = 0.5: rows 1 and 2 fall below 1 − h, row 0 would go on
    alone = _step(accept, judge_at, lockstep=False, bound=0.3, k=k)
    assert alone[1] == [True, False, False]  # each row stops on its own
    take, drafting, p_hat, stopped = _step(accept, judge_at, lockstep=True, bound=0.3, k=k)
    assert drafting == [True, True, True] and take == [True, True, True] and not stopped
    assert p_hat == pytest.approx(accept)  # their P̂ stays what the head said


@pytest.mark.parametrize("judge_at,k", [(SAMPLE, 1), (FEED, 2)])
def test_the_batch_stops_as_one(judge_at, k):
    # no row would go on: all stop, and it is not the batch rule's stop
    _, drafting, _, stopped = _step([0.4, 0.1, 0.3], judge_at, lockstep=True, bound=0.3, k=k)
    assert drafting == [False, False, False] and not stopped
    # the batch rule sums every row's P̂, the unwilling too: 0.9 + 0.1 + 0.3 = 1.3
    _, drafting, _, stopped = _step([0.9, 0.1, 0.3], judge_at, lockstep=True, bound=1.3, k=k)
    assert drafting == [False, False, False] and stopped
    _, drafting, _, stopped = _step([0.9, 0.1, 0.3], judge_at, lockstep=True, bound=1.29, k=k)
    assert drafting == [True, True, True] and not stopped


def test_a_feed_head_judges_nothing_at_the_first_forward():
    take, drafting, p_hat, stopped = _step([0.1, 0.1], FEED, lockstep=True, bound=10.0, k=1)
    assert take == drafting == [True, True] and p_hat == [1.0, 1.0] and not stopped
