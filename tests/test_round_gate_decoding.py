"""Decodes under the round gate of batched SpecDec++ (`acchead.inference.round_gate`): greedy rows equal the
target's on each prompt alone (eager, fast twin, feature draft), a gate that caps rounds keeps them exact, a
sampled row follows the target's exact distribution."""

from __future__ import annotations

import functools

import pytest
import torch
from exact_models import _peaked_llama, _perturbed
from test_batched import CHI_SAMPLES, MAX_NEW, PROMPTS, _decoder, _heads, row_one_p_value, sample_row_one
from test_feature_draft import trained_feature_pair
from torch._dynamo.utils import counters

import acchead.inference.batched as batched
from acchead.inference.batch_stop import BatchStop
from acchead.inference.batched import BatchedDecoder
from acchead.inference.round_gate import GateMemory


@pytest.fixture(scope="module")
def peaked_pair():
    target = _peaked_llama(12, seed=3)
    return target, _perturbed(target, 0.5, seed=4)


@pytest.fixture
def early_gates(monkeypatch):
    """Gates that weigh after 8 rows' open rounds (32 by default: more than these short decodes make)."""
    monkeypatch.setattr(batched, "GateMemory", functools.partial(GateMemory, min_observations=8))


# c = 0.9: a drafting round prices at ~2 autoregressive rounds, so the gate closes on this pair
GATED = BatchStop(0.9, gate=True)


@pytest.mark.parametrize(("spec", "kind"), [("specdecpp:h=0.5,max=4", "candidate"),
                                            ("specdecpp:h=0.4,max=4", "lookahead")])  # fmt: skip
@pytest.mark.parametrize("fast", [False, True])
def test_gated_greedy_rows_equal_generate_alone(peaked_pair, spec, kind, fast, early_gates):
    """The gate closes mid-decode (rows then decode autoregressively, the draft left behind): every row still
    equals the target's greedy `generate` on its prompt alone, on the eager path and the fast path's twin."""
    target, _ = peaked_pair
    dec = _decoder(peaked_pair, spec, kind, batch_stop=GATED, fast=fast, compile=False)
    res = dec.generate(PROMPTS, max_new_tokens=MAX_NEW, temperature=0, eos_token_id=5)
    assert res.gate_rounds > 0 and res.draft_calls > 0  # it drafted, then it closed
    assert res.to_dict()["gate_rounds"] == res.gate_rounds
    # the fast path's first round fed the draft the prompts uncompiled, timed: the rate the next decode's
    # gate prices the draft's prefill at (the eager path feeds them in its round's own forward)
    assert (dec._feed.catch_up_tokens > 0 and dec._feed.catch_up_s > 0) is fast
    # the 2nd decode explores again (so do the 4th, 8th, ...), its open rounds capped at 2 (the first
    # closed), and closes; the 3rd starts from the tallies: closed before its first round, nothing drafted
    explored = dec.generate(PROMPTS, max_new_tokens=MAX_NEW, temperature=0, eos_token_id=5)
    assert explored.gate_rounds > 0 and 0 < max(explored.round_draft_calls) <= 2
    again = dec.generate(PROMPTS, max_new_tokens=MAX_NEW, temperature=0, eos_token_id=5)
    assert again.draft_calls == 0 and again.gate_rounds == again.target_calls
    for b, prompt in enumerate(PROMPTS):
        ref = target.generate(torch.tensor([prompt]), max_new_tokens=MAX_NEW[b], do_sample=False,
                              eos_token_id=5, pad_token_id=0)[0, len(prompt) :]  # fmt: skip
        outs = [r.rows[b].new_ids.tolist() for r in (res, explored, again)]
        assert outs == [ref.tolist()] * 3, b
    ungated = _decoder(peaked_pair, spec, kind, batch_stop=BatchStop(0.9), fast=fast, compile=False)
    assert ungated.generate(PROMPTS, max_new_tokens=MAX_NEW, temperature=0).gate_rounds == 0


@pytest.mark.parametrize(("spec", "kind", "cap"), [("specdecpp:h=0.5,max=4", "candidate", 2),
                                                   ("specdecpp:h=0.4,max=4", "lookahead", 1)])  # fmt: skip
def test_gate_that_caps_rounds_keeps_rows_exact(spec, kind, cap, monkeypatch, early_gates):
    """A draft close to its target (perturbed by 0.05) and c = 0.05: the gate caps the rounds below the
    policy's 4 (a cap it chose from the open rounds' counterfactual gains), and the rows, drafted at most that
    many candidates a round from then on, still equal the target's greedy `generate` alone."""
    target = _peaked_llama(12, seed=3)
    pair = (target, _perturbed(target, 0.05, seed=4))
    gates = []
    remember = GateMemory.remember
    monkeypatch.setattr(GateMemory, "remember", lambda self, gate: (gates.append(gate), remember(self, gate)))
    dec = _decoder(pair, spec, kind, batch_stop=BatchStop(0.05, gate=True))
    res = dec.generate(PROMPTS, max_new_tokens=20, temperature=0)
    assert gates[0].choice == cap and res.gate_rounds == 0
    opened = int(gates[0].own.rounds[-1])  # the open rounds (the only ones pricing K), then the choice
    for b, prompt in enumerate(PROMPTS):
        ref = target.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False, eos_token_id=None,
                              pad_token_id=0)[0, len(prompt) :]  # fmt: skip
        row = res.rows[b]
        assert row.new_ids.tolist() == ref.tolist(), b
        assert row.rounds > opened and max(row.drafted_per_round[opened:]) <= cap  # capped after the choice


@pytest.mark.parametrize("compile", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_gated_feature_draft_rows_equal_generate_alone(tmp_path_factory, compile, early_gates):
    """A feature draft under the gate: a closed gate's rounds verify without the target's states (another
    shape, compiled by `warm_up`: nothing compiles while decoding), rows equal to the target's alone."""
    target, draft = trained_feature_pair(tmp_path_factory)
    head = _heads(draft.config.hidden_size)["lookahead"]
    prompts = [[5, 9, 2, 7], [3], [8, 1, 4]]
    dec = BatchedDecoder(target, draft, "specdecpp:h=0.5,max=5", head=head, batch_stop=GATED, fast=compile,
                         compile=compile)  # fmt: skip
    dec.warm_up(len(prompts), 20)
    graphs = counters["stats"]["unique_graphs"]
    res = dec.generate(prompts, max_new_tokens=16, temperature=0)
    dec.generate(prompts, max_new_tokens=16, temperature=0)  # the 2nd decode explores again
    again = dec.generate(prompts, max_new_tokens=16, temperature=0)  # closed from the prefill on
    assert counters["stats"]["unique_graphs"] == graphs and res.gate_rounds > 0 and again.draft_calls == 0
    for b, prompt in enumerate(prompts):
        ref = target.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False, eos_token_id=None,
                              pad_token_id=0)  # fmt: skip (no EOS: the config's would end row 0 at once)
        ref = ref[0, len(prompt) :].tolist()
        assert res.rows[b].new_ids.tolist() == again.rows[b].new_ids.tolist() == ref, b


def test_chi_square_gated_row(peaked_pair, monkeypatch):
    """Row 1 of a ragged batch under the gate deciding from the first drafting round (2 observations; each
    decode from its own), so whether the next round drafts depends on how the first went: its 3-token
    continuations follow the target's exact distribution."""
    target, _ = peaked_pair
    fresh = functools.partial(GateMemory, explore_share=1.0, min_observations=2)  # each decode its own gate
    monkeypatch.setattr(batched, "GateMemory", fresh)
    dec = _decoder(peaked_pair, "specdecpp:h=0.4,max=2", "lookahead", batch_stop=GATED)
    counts, results = sample_row_one(dec)
    gated = sum(res.gate_rounds > 0 and res.rows[1].rounds > 1 for res in results)
    assert 0 < gated < CHI_SAMPLES  # the gate closed in some decodes and not in others while row 1 decoded
    assert row_one_p_value(target, counts) > 1e-3
