"""`HeadCall`, the acceptance head as the decoder calls it once per candidate: the same logit as the module on
the inputs training builds, on every input set, with the token folded into its first layer or not."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_lookahead import ALL_INPUTS, lookahead_head

from acchead.errors import AccheadError
from acchead.inference import head_call
from acchead.inference.drafters import ModelDrafter
from acchead.lookahead import lookahead_inputs
from acchead.sampling import SamplingConfig


@pytest.mark.parametrize("fold", [True, False], ids=["token-table", "no-table"])
@pytest.mark.parametrize("inputs", [("state", "token"), ALL_INPUTS, ("state", "logq", "topk"),
                                    ("state", "depth"), (*ALL_INPUTS, "depth"), ("logq", "entropy", "topk"),
                                    ("logq", "token")], ids="+".join)  # fmt: skip
@pytest.mark.parametrize("cfg", [SamplingConfig(0.0), SamplingConfig(1.0, top_k=20)], ids=str)
@pytest.mark.parametrize("width", [None, 8], ids=["width-hidden", "width-8"])
def test_head_call_logit_is_the_head_on_the_training_inputs(
    tiny_llama_pair, cfg, inputs, fold, width, monkeypatch
):
    """`HeadCall.logit` (the decoder's per-candidate path: views, the token folded into the first layer)
    equals the module on the vector training builds, with the token table and without it, at the draft's
    width and narrower."""
    if not fold:
        monkeypatch.setattr(head_call, "TOKEN_TABLE_MAX", 0)
    # the tiny vocabulary's top-k in two passes too (320 entries: 20 blocks of 16)
    monkeypatch.setattr(head_call, "TOP_TWO_PASS_MIN", 0)
    monkeypatch.setattr(head_call, "TOP_BLOCK", 16)
    _, draft = tiny_llama_pair
    drafter = ModelDrafter(draft)
    drafter.begin(torch.tensor([3, 5, 7]), cfg, 0)
    head = lookahead_head(32, inputs, depth=2, bias=0.3, width=width)
    call = head_call.HeadCall(head)
    call.attach_draft(draft)
    assert (call._token_table is not None) == (fold and "token" in inputs)
    out_emb = draft.get_output_embeddings().weight.detach()
    for k in range(1, 6):  # candidate k's depth is k - 1 (the 4th and later share the last one-hot column)
        step = drafter.propose(torch.tensor([3, 5, 7, 9, 11, 2, 4][: 2 + k]), k, want_hidden=False,
                               want_state=True)  # fmt: skip
        x = lookahead_inputs(inputs, step.state[None], torch.tensor([step.token]), out_emb, cfg,
                             depth=torch.tensor([k - 1]))  # fmt: skip
        with torch.inference_mode():  # as the decoders call it
            want = float(head(x)[0])
            assert float(call.logit(step)) == pytest.approx(want, abs=1e-4)
            assert float(call.logit_of(x[0])) == pytest.approx(want, abs=1e-5)


@pytest.mark.parametrize("n", [512, 4096, 5000, 12224])
def test_top_values_equal_one_topk(n, monkeypatch):
    """`head_call.top_values` (two passes on a long CPU vector) gives `topk`'s values exactly: ties, -inf
    entries and a length that is no multiple of the block included, and one pass below its minimum."""
    monkeypatch.setattr(head_call, "TOP_TWO_PASS_MIN", 1024)
    g = torch.Generator().manual_seed(n)
    x = (torch.randn(n, generator=g) * 4).round()  # many ties among the largest
    x[torch.randperm(n, generator=g)[: n // 3]] = float("-inf")
    for k in (1, 8):
        assert torch.equal(head_call.top_values(x, k), x.topk(k).values)
    spread = torch.full((n,), -30.0)
    spread[[0, n // 2, n - 1]] = torch.tensor([1.0, 2.0, 3.0])  # the top values in three far blocks
    assert torch.equal(head_call.top_values(spread, 8), spread.topk(8).values)


@pytest.mark.parametrize("inputs", [("logq", "entropy", "topk"), ("logq", "token", "depth")], ids="+".join)
def test_a_state_free_head_reads_no_state(tiny_llama_pair, inputs):
    """A head that does not read the state takes nothing from `step.state`: a drafter that returns none
    gives the same logit; a head that reads it refuses such a step in one line."""
    _, draft = tiny_llama_pair
    drafter = ModelDrafter(draft)
    drafter.begin(torch.tensor([3, 5, 7]), SamplingConfig(0.0), 0)
    step = drafter.propose(torch.tensor([3, 5, 7]), 1, want_hidden=False, want_state=True)
    call = head_call.HeadCall(lookahead_head(32, inputs, depth=2, bias=0.3))
    call.attach_draft(draft)
    stateless = dataclasses.replace(step, state=None)
    assert torch.equal(call.logit(stateless), call.logit(step))
    with_state = head_call.HeadCall(lookahead_head(32, ("state", *inputs), depth=2))
    with_state.attach_draft(draft)
    with pytest.raises(AccheadError, match="needs the drafter's states"):
        with_state.logit(stateless)
