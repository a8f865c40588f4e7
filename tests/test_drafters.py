"""The `Drafter` interface (acchead.inference.drafters): every member the decoder uses is declared, so a
drafter that lacks one is refused when it is built, and the decoder never probes for optional ones."""

from __future__ import annotations

import pytest
import torch

from acchead.errors import AccheadError
from acchead.inference.decoder import SpeculativeDecoder
from acchead.inference.draft_round import draft_round
from acchead.inference.drafters import Drafter, DraftStep, ModelDrafter, RoundBufferDrafter
from acchead.inference.policy_build import parse_policy
from acchead.sampling import SamplingConfig

VOCAB = 5


class Counting(Drafter):
    """Candidate k after a context of length n is (n + k) mod V, with a q that depends on the context."""

    def __init__(self, round_unit: bool = False) -> None:
        self.round_unit = round_unit
        self.draft_calls = 0
        self.proposed: list[int] = []  # the index of every `propose` call

    def begin(self, input_ids: torch.Tensor, sampling: SamplingConfig, seed: int) -> None:
        self.draft_calls = 0

    def propose(self, context, index, want_hidden, want_state=False, judge=None) -> DraftStep:
        self.proposed.append(index)
        token = (context.numel() + 1) % VOCAB
        q = torch.full((VOCAB,), 0.1)
        q[token] = 1.0 - 0.1 * (VOCAB - 1)
        return DraftStep(token=torch.tensor(token), q=q, hidden=None, index=index)

    def rollback(self, length: int) -> None:
        pass


def test_a_drafter_missing_a_member_cannot_be_built():
    class NoRollback(Drafter):
        def begin(self, input_ids, sampling, seed):
            pass

        def propose(self, context, index, want_hidden, want_state=False, judge=None):
            raise AssertionError("not called")

    with pytest.raises(TypeError, match="rollback"):
        NoRollback()

    class NoBlock(RoundBufferDrafter):  # a round-buffer drafter must say how it computes its block
        def begin(self, input_ids, sampling, seed):
            pass

    with pytest.raises(TypeError, match="_propose_block"):
        NoBlock()


def test_the_decoder_refuses_what_is_not_a_drafter(tiny_llama_pair):
    """An object with the right methods but outside the interface (it could lack `round_unit`, `device`,
    `warm_up`, ...) is refused at construction, not probed at decode time."""
    target, _ = tiny_llama_pair

    class DuckDrafter:
        draft_calls = 0

        def begin(self, input_ids, sampling, seed):
            pass

        def propose(self, context, index, want_hidden, want_state=False, judge=None):
            raise AssertionError("not called")

        def rollback(self, length):
            pass

    with pytest.raises(AccheadError, match="must be a PreTrainedModel, a Drafter"):
        SpeculativeDecoder(target, DuckDrafter(), policy="specdec:k=2")


def test_typed_defaults_describe_a_host_driven_drafter(tiny_llama_pair):
    d = Counting()
    assert not d.round_unit and d.device == torch.device("cpu")
    d.warm_up(16, SamplingConfig(0.0), parse_policy("specdec:k=2"))  # nothing to prepare
    model = ModelDrafter(tiny_llama_pair[1])
    assert isinstance(model, Drafter) and model.device == tiny_llama_pair[1].device


@pytest.mark.parametrize("k", [1, 3])
def test_a_round_unit_drafts_what_single_proposals_draft(k):
    """A fixed-length round goes to `propose_block` when the drafter has a round unit (the default block:
    one unjudged proposal per candidate); the tokens and q equal the step-by-step round's."""
    rounds = {}
    for round_unit in (False, True):
        drafter = Counting(round_unit=round_unit)
        run = parse_policy(f"specdec:k={k}").start_decode()
        cap = run.start_round(0)
        seq = torch.tensor([3, 1, 4, *[0] * (cap + 1)])
        steps = draft_round(drafter, run, seq, 3, cap)
        tokens = [s.token.item() for s in steps]
        rounds[round_unit] = (seq.tolist(), tokens, torch.stack([s.q for s in steps]))
        assert drafter.proposed == list(range(1, k + 1))
    (seq0, tok0, q0), (seq1, tok1, q1) = rounds[False], rounds[True]
    assert seq0 == seq1 and tok0 == tok1 == [(3 + i + 1) % VOCAB for i in range(k)]
    assert torch.equal(q0, q1)
