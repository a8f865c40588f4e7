"""Head-overhead timing for both head kinds on a tiny random Llama draft."""

from __future__ import annotations

import pytest
import torch

from acchead.head import AcceptanceHead
from acchead.inference.bench.head_timing import time_head_overhead
from acchead.inference.specdecpp_policy import SpecDecPP
from acchead.sampling import SamplingConfig

LOOKAHEAD_INPUTS = ("state", "logq", "entropy", "token")


@pytest.mark.parametrize(
    ("kind", "inputs", "sampling"),
    [
        ("candidate", ("state",), SamplingConfig(0.0)),
        ("lookahead", LOOKAHEAD_INPUTS, SamplingConfig(0.0)),
        ("lookahead", LOOKAHEAD_INPUTS, SamplingConfig(1.0, top_k=20)),
        ("lookahead", ("state",), SamplingConfig(0.0)),
    ],
)
def test_head_overhead_is_timed_for_both_kinds(tiny_llama_pair, monkeypatch, kind, inputs, sampling):
    _, draft = tiny_llama_pair
    head = AcceptanceHead(32, 1, kind=kind, inputs=inputs)
    seen = []
    should_stop = SpecDecPP.should_stop

    def spy(self: SpecDecPP, run, step):  # the timed call, through the decoder's own code path
        seen.append((step, self.lookahead_input(step) if self.lookahead else None))
        return should_stop(self, run, step)

    monkeypatch.setattr(SpecDecPP, "should_stop", spy)
    prompt = torch.tensor([[5, 17, 42, 8, 99, 3]])
    o = time_head_overhead(draft, head, prompt, calls=3, sampling=sampling)
    assert o.calls == 3 and o.context == 6
    assert o.head_s > 0 and o.draft_step_s > 0 and o.ratio == pytest.approx(o.head_s / o.draft_step_s)
    assert all(isinstance(v, float | int) for v in o.to_dict().values())
    step, x = seen[0]
    if kind == "candidate":
        assert step.hidden is not None and step.state is None
        return
    # A lookahead step: the state at the last prompt position (the one that produced q), a candidate
    # token, its q, and the logits only under greedy (where q is one-hot), as the drafter builds it.
    assert step.hidden is None and step.state.shape == (32,)
    assert (step.logits is not None) == sampling.greedy
    assert float(step.q.sum()) == pytest.approx(1.0)
    assert x.shape == (head.input_size,)
    if "token" in inputs:  # the output-embedding row was attached from the draft
        emb = draft.get_output_embeddings().weight[step.token]
        assert torch.equal(x[-32:], emb.detach().float())
