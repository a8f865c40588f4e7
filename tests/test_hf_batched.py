"""A batch through transformers' `generate` (`acchead.inference.hf_batched`): left-padded prompts decode as
one ragged batch, each row token for token its own greedy output alone, rows that end early padded, per-row
criteria and seeds; what a batch cannot take is refused in one line."""

# ruff: noqa: F811  (the fixtures imported from hf_pair are test arguments of the same names)

from __future__ import annotations

import pytest
import torch
from hf_pair import Record, head, pair  # noqa: F401  (pytest fixtures, used by name)
from transformers import StoppingCriteriaList, StopStringCriteria

from acchead.errors import AccheadError
from acchead.inference import hf, hf_decoders
from acchead.inference.batch_stop import BatchStop
from acchead.inference.batched import BatchedDecoder

PROMPTS = ["def f(x):", "import os\nfor i in range(3):", "class A:"]


@pytest.fixture
def batch(tiny_tokenizer):
    """The three prompts padded on the left to one (3, T) batch."""
    return tiny_tokenizer(PROMPTS, return_tensors="pt", padding=True, padding_side="left")


def _alone(target, tokenizer, prompt: str, **kw) -> list[int]:
    """transformers' own greedy continuation of one unpadded prompt."""
    ids = tokenizer(prompt, return_tensors="pt")
    out = target.generate(**ids, do_sample=False, **kw)
    return out[0, ids["input_ids"].shape[1] :].tolist()


@pytest.mark.parametrize("how", [{"policy": "specdecpp:h=0.5,max=6", "batch_stop": 0.2},
                                 {"policy": "specdec:k=3", "verifier": "block"}, {"policy": "autoregressive"},
                                 {"spec": "copy:min=2+specdec:k=2"}], ids=str)  # fmt: skip
def test_rows_equal_their_greedy_output_alone(pair, head, batch, tiny_tokenizer, how):
    target, draft = pair
    out = target.generate(**batch, draft=draft, head=head if "policy" in how else None,
                          custom_generate=hf.generate, max_new_tokens=16, do_sample=False, **how)  # fmt: skip
    t = batch["input_ids"].shape[1]
    assert out.shape == (3, t + 16) and torch.equal(out[:, :t], batch["input_ids"])  # the prompts as given
    for b, prompt in enumerate(PROMPTS):
        assert out[b, t:].tolist() == _alone(target, tiny_tokenizer, prompt, max_new_tokens=16)


def test_a_row_that_ends_early_is_padded_and_criteria_run_per_row(pair, head, batch, tiny_tokenizer):
    """Row 1 stops at an EOS id taken from its own greedy text, row 2 at a stop string from its own; the
    others run on, and the ended rows are padded with the pad id (the tokenizer's, EOS here)."""
    target, draft = pair
    greedy = [_alone(target, tiny_tokenizer, p, max_new_tokens=16) for p in PROMPTS]
    eos = greedy[1][5]
    assert eos not in greedy[0] and eos not in greedy[2]  # the pair's text (seeded) keeps this test sharp
    stop = tiny_tokenizer.decode(greedy[2][7:9])
    criteria = StoppingCriteriaList([StopStringCriteria(tiny_tokenizer, [stop])])
    kw = dict(max_new_tokens=16, do_sample=False, eos_token_id=eos, pad_token_id=tiny_tokenizer.pad_token_id)
    out = target.generate(**batch, draft=draft, head=head, policy="specdecpp:h=0.5,max=6",
                          custom_generate=hf.generate, stopping_criteria=criteria, **kw)  # fmt: skip
    t, pad = batch["input_ids"].shape[1], tiny_tokenizer.pad_token_id
    lengths = []
    for b, prompt in enumerate(PROMPTS):
        ids = tiny_tokenizer(prompt, return_tensors="pt")
        alone = target.generate(**ids, stopping_criteria=criteria, **kw)[0, ids["input_ids"].shape[1] :]
        row = out[b, t:].tolist()
        assert row[: alone.numel()] == alone.tolist() and set(row[alone.numel() :]) <= {pad}
        lengths.append(alone.numel())
    assert lengths == [16, 6, 9] and out.shape[1] - t == 16  # row 0 ran to the limit, the others ended


def test_sampled_rows_are_the_batched_decoders_and_the_dict_counts_the_batch(pair, head, batch):
    """Under sampling each row b draws with seed + b, as `BatchedDecoder.generate` does: the same tokens
    as calling it on the unpadded rows; `return_dict_in_generate` carries the batch's forwards."""
    target, draft = pair
    kw = dict(max_new_tokens=12, do_sample=True, temperature=0.9, top_k=0)
    out = target.generate(**batch, draft=draft, head=head, policy="specdec:k=2", custom_generate=hf.generate,
                          seed=7, return_dict_in_generate=True, **kw)  # fmt: skip
    rows = [ids[keep.bool()] for ids, keep in zip(batch["input_ids"], batch["attention_mask"], strict=True)]
    ref = BatchedDecoder(target, draft, "specdec:k=2").generate(rows, 12, temperature=0.9, seed=7)
    t = batch["input_ids"].shape[1]
    assert [out.sequences[b, t : t + r.new_ids.numel()].tolist() for b, r in enumerate(ref.rows)] == [
        r.new_ids.tolist() for r in ref.rows
    ]
    assert out.target_calls == out.rounds == ref.target_calls and out.draft_calls == ref.draft_calls
    assert out.accepted_per_round is None and out.drafted == sum(r.drafted for r in ref.rows)


def test_a_batch_reuses_its_decoder_and_specdecpp_takes_the_batch_rule_by_default(pair, head, batch):
    target, draft = pair
    hf_decoders.DECODERS.release(target)  # the earlier tests' decoders
    kw = dict(draft=draft, head=head, custom_generate=hf.generate, max_new_tokens=4, do_sample=False)
    try:
        for policy in ("specdec:k=2", "specdec:k=2", "specdecpp:h=0.7,max=6"):
            target.generate(**batch, policy=policy, **kw)
        decoders = hf_decoders.DECODERS.decoders(target)
        assert [type(d).__name__ for d in decoders] == ["BatchedDecoder"] * 2
        assert decoders[0].batch_stop is None  # fixed K: no batch rule
        assert decoders[1].batch_stop == BatchStop.from_h(0.7)  # c = 1 - h, acchead-decode's default
    finally:
        hf_decoders.DECODERS.release(target)


def test_what_a_batch_cannot_take_is_one_line(pair, head, batch):
    target, draft = pair
    kw = dict(draft=draft, head=head, custom_generate=hf.generate, max_new_tokens=4, do_sample=False)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    cases = [
        (dict(input_ids=ids, attention_mask=mask.flip(1), policy="specdec:k=2"), "pad on the left"),
        (dict(input_ids=ids, attention_mask=mask * torch.tensor([[1], [0], [1]]), policy="specdec:k=2"),
         "row 1 of the batch is all padding"),
        (dict(input_ids=ids, attention_mask=mask, policy="specdec:k=2", stream_to=Record()),
         "a streamer takes one sequence"),
        (dict(input_ids=ids, attention_mask=mask, policy="ucb:arms=specdec:k=1|specdec:k=2"),
         "batched decoding runs autoregressive, specdec"),
        (dict(input_ids=ids, attention_mask=mask, policy="specdec:k=2", batch_stop=0.2),
         "the batch stop rule reads the heads"),
    ]  # fmt: skip
    for case, message in cases:
        with pytest.raises(AccheadError, match=message) as e:
            target.generate(**case, **kw)
        assert "\n" not in str(e.value)


def test_the_padding_in_and_out():
    """`ragged_prompts`: the mask's ones, left padding only (no mask: whole rows); `padded_output`: rows
    that ended early padded, refused in one line when there is no id to pad with."""
    from acchead.inference.hf_batched import padded_output, ragged_prompts

    ids = torch.tensor([[0, 0, 5, 6], [1, 2, 3, 4]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    assert [p.tolist() for p in ragged_prompts(ids, mask)] == [[5, 6], [1, 2, 3, 4]]
    assert [p.tolist() for p in ragged_prompts(ids, None)] == ids.tolist()
    out = padded_output(ids, [torch.tensor([7]), torch.tensor([8, 9, 10])], pad_id=0)
    assert out.tolist() == [[0, 0, 5, 6, 7, 0, 0], [1, 2, 3, 4, 8, 9, 10]]
    assert padded_output(ids, [torch.tensor([7]), torch.tensor([8])], pad_id=None).shape == (2, 5)
    with pytest.raises(AccheadError, match="neither a pad_token_id nor an EOS id"):
        padded_output(ids, [torch.tensor([7]), torch.tensor([8, 9])], pad_id=None)


@pytest.mark.slow
def test_a_batch_on_the_fast_path_decodes_the_eager_rows(pair, head, batch):
    """`fast=True` reaches the `BatchedDecoder` (static caches, compiled forwards): the same greedy rows."""
    target, draft = pair
    kw = dict(draft=draft, head=head, policy="specdecpp:h=0.5,max=4", custom_generate=hf.generate,
              max_new_tokens=12, do_sample=False)  # fmt: skip
    try:
        eager = target.generate(**batch, **kw)
        fast = target.generate(**batch, fast=True, **kw)
        assert torch.equal(fast, eager)
        assert [d.fast for d in hf_decoders.DECODERS.decoders(target)][-1] is True
    finally:
        hf_decoders.DECODERS.release(target)
