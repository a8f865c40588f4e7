"""The lookahead head kind (DESIGN §3.1): its inputs, data, training, and exact decoding with it."""

from __future__ import annotations

import json
import math
import warnings
from collections import Counter

import numpy as np
import pytest
import torch
from exact_models import _chi_square_p_value, _exact_sequences
from test_exactness import VERIFIERS, WORLDS, World, decoded_dist, tv
from test_gen_data_cli import PROMPTS, base_args, write_jsonl

import acchead
from acchead.data_gen import cli as gen_cli
from acchead.errors import AccheadError
from acchead.head import AcceptanceHead
from acchead.head_io import HeadMetadata, load_head, save_head
from acchead.inference.decoder import SpeculativeDecoder
from acchead.inference.drafters import ModelDrafter
from acchead.inference.policy_build import parse_policy
from acchead.inference.specdecpp_policy import SpecDecPP
from acchead.lookahead import (
    LOGQ_FLOOR,
    TOPK_WIDTH,
    assemble_inputs,
    candidate_stats,
    check_kind,
    feature_logprobs,
    input_size,
    lookahead_inputs,
    parse_inputs,
)
from acchead.models import model_identity
from acchead.sampling import SamplingConfig
from acchead.train import cli as train_cli
from acchead.train.data import load_gen_data

ALL_INPUTS = ("state", "logq", "entropy", "token", "topk")


def lookahead_head(
    hidden: int, inputs=("state",), depth: int = 1, bias: float = 0.0, width: int | None = None
) -> AcceptanceHead:
    torch.manual_seed(0)
    head = AcceptanceHead(hidden, depth, kind="lookahead", inputs=inputs, width=width)
    with torch.no_grad():
        head.out.bias.fill_(bias)
    return head.eval()


# ------------------------------------------------------------------------------------------ the head


def test_kinds_and_inputs_are_validated():
    assert parse_inputs("token+state,logq") == ("state", "logq", "token")
    assert input_size(ALL_INPUTS, 16) == 16 + 1 + 1 + 16 + 8
    for kind, inputs in (("paper", ("state",)), ("candidate", ("state", "logq")), ("lookahead", ())):
        with pytest.raises(AccheadError):
            check_kind(kind, inputs)
    # a lookahead head may leave the state out (the draft's statistics alone: `logq+entropy+topk`)
    assert check_kind("lookahead", ("topk", "logq")) == ("logq", "topk")
    assert input_size(("logq", "entropy", "topk"), 16) == 10
    with pytest.raises(AccheadError):
        parse_inputs("state+bogus")


def test_state_only_head_is_the_papers_architecture():
    a, b = AcceptanceHead(16, 2), AcceptanceHead(16, 2, kind="lookahead")
    assert a.proj is None and b.proj is None
    assert a.state_dict().keys() == b.state_dict().keys()
    assert AcceptanceHead(16, 2, kind="lookahead", inputs=ALL_INPUTS).proj.in_features == 42
    assert AcceptanceHead(16, 2, width=16).proj is None  # the state's own width: still the paper's head


def test_a_narrow_head_projects_its_input_to_its_width():
    head = AcceptanceHead(16, 2, kind="lookahead", inputs=("state", "logq"), width=4)
    assert (head.proj.in_features, head.proj.out_features, head.out.in_features) == (17, 4, 4)
    assert [b.linear.weight.shape for b in head.blocks] == [(4, 4)] * 2
    assert AcceptanceHead(16, 0, width=4).proj.out_features == 4  # a state-only head projects too
    assert head(torch.randn(3, 17)).shape == (3,)
    with pytest.raises(ValueError, match="width"):
        AcceptanceHead(16, 2, width=0)


def test_candidate_stats_are_log_q_entropy_and_top_log_probs_of_the_requested_columns():
    q = torch.tensor([[0.5, 0.25, 0.125, 0.125] + [0.0] * 8])  # (1, 12): top-k zeros
    lp = feature_logprobs(q.log(), SamplingConfig(1.0))  # S = identity at T 1: log q, floored
    assert lp.min() == -LOGQ_FLOOR  # log 0 never reaches the head as -inf
    token = torch.tensor([1])
    every = candidate_stats(lp, token, ("state", "logq", "entropy", "topk"))
    assert every.shape == (1, 1 + 1 + TOPK_WIDTH)
    assert every[0, 0].item() == pytest.approx(math.log(0.25))
    assert every[0, 1].item() == pytest.approx(1.75 * math.log(2), abs=1e-6)  # H in nats; zeros add ~1e-11
    want_top = [math.log(x) for x in (0.5, 0.25, 0.125, 0.125)] + [-LOGQ_FLOOR] * 4
    assert every[0, 2:].tolist() == pytest.approx(want_top, abs=1e-6)
    # only what a head reads is computed, and assemble_inputs finds each column where it is
    only_top = candidate_stats(lp, token, ("state", "topk"))
    assert torch.equal(only_top, every[:, 2:])
    x = assemble_inputs(("state", "entropy", "topk"), torch.zeros(1, 3), token, None,
                        candidate_stats(lp, token, ("state", "entropy", "topk")))
    assert torch.equal(x[0, 3:], every[0, 1:])


@pytest.mark.parametrize("width", [None, 8, 3])
def test_lookahead_head_round_trips_and_old_heads_load_as_candidate(tmp_path, width):
    head = lookahead_head(8, ("state", "logq", "token"), depth=2, width=width)
    meta = HeadMetadata(depth=2, hidden_size=8, w_acc=1.0, w_rej=3.0, draft={"hidden_size": 8},
                        sampling=SamplingConfig(0.0).to_dict(), kind="lookahead",
                        inputs=["state", "logq", "token"], width=width)
    path = save_head(head, tmp_path / "h.safetensors", meta=meta)
    back, meta2 = load_head(path)
    assert back.kind == meta2.kind == "lookahead" and back.inputs == ("state", "logq", "token")
    assert back.width == (width or 8) and meta2.width == width
    x = torch.randn(5, 17)
    assert torch.allclose(back(x), head(x))
    # metadata written before kinds existed: no "kind"/"inputs" keys -> a candidate head
    old = HeadMetadata.from_json(json.dumps({"depth": 1, "hidden_size": 8, "w_acc": 1, "w_rej": 6,
                                             "draft": {}, "sampling": SamplingConfig().to_dict()}))
    assert old.kind == "candidate" and old.inputs == ["state"] and old.width is None
    with pytest.raises(ValueError, match="width"):  # metadata that names another width
        save_head(head, tmp_path / "bad.safetensors", meta=HeadMetadata(**{**meta.__dict__, "width": 5}))
    with pytest.raises(ValueError, match="kind"):
        save_head(head, tmp_path / "bad.safetensors", meta=HeadMetadata(
            depth=2, hidden_size=8, w_acc=1, w_rej=3, draft={}, sampling=SamplingConfig().to_dict()))


def test_the_depth_input_is_a_one_hot_of_the_candidates_place():
    x = assemble_inputs(("state", "depth"), torch.zeros(6, 2), torch.zeros(6), None, None,
                        depth=torch.tensor([0, 1, 2, 3, 4, 9]))  # fmt: skip
    assert x[:, 2:].argmax(-1).tolist() == [0, 1, 2, 3, 3, 3] and input_size(("state", "depth"), 2) == 6
    with pytest.raises(AccheadError, match="depth"):
        assemble_inputs(("state", "depth"), torch.zeros(1, 2), torch.zeros(1), None, None)


# ------------------------------------------------------------------- decoding: inputs match training


@pytest.mark.parametrize("cfg", [SamplingConfig(0.0), SamplingConfig(1.0, top_k=20), SamplingConfig(0.7)])
def test_decoder_inputs_equal_the_training_inputs(tiny_llama_pair, cfg):
    """The policy builds a candidate's input from the drafter's logits; training rebuilds it from the cached
    state as state @ out_emb.T. Both must give the same vector (else the head is fed another feature)."""
    _, draft = tiny_llama_pair
    drafter = ModelDrafter(draft)
    drafter.begin(torch.tensor([3, 5, 7]), cfg, 0)
    step = drafter.propose(torch.tensor([3, 5, 7]), 1, want_hidden=False, want_state=True)
    with torch.no_grad():
        ref_state = draft(torch.tensor([[3, 5, 7]]), output_hidden_states=True).hidden_states[-1][0, -1]
    assert torch.allclose(step.state, ref_state, atol=1e-5)
    pol = SpecDecPP(lookahead_head(32, ALL_INPUTS), h=0.5)
    pol.attach_draft(draft)
    got = pol.lookahead_input(step)
    out_emb = draft.get_output_embeddings().weight.detach()
    want = lookahead_inputs(ALL_INPUTS, step.state[None], torch.tensor([step.token]), out_emb, cfg)[0]
    assert torch.allclose(got, want, atol=1e-4)


def test_a_depth_head_runs_on_the_eager_path_only(tiny_llama_pair):
    """The candidate's index is a host int: a compiled draft step would trace it as a constant, and the
    batched decoder does not carry it, so both refuse such a head in one line."""
    from acchead.inference.batched import BatchedDecoder

    target, draft = tiny_llama_pair
    head = lookahead_head(32, ("state", "depth"))
    with pytest.raises(AccheadError, match="eager path only"):
        SpeculativeDecoder(target, draft, policy="specdecpp:h=0.5", head=head, fast=True)
    with pytest.raises(AccheadError, match="depth"):
        BatchedDecoder(target, draft, policy="specdecpp:h=0.5", head=head)
    dec = SpeculativeDecoder(target, draft, policy="specdecpp:h=0.5,max=4", head=head, fast=False)
    ref = target.generate(torch.tensor([[3, 5, 7]]), max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert dec.generate(torch.tensor([[3, 5, 7]]), max_new_tokens=12, temperature=0).new_ids.tolist() == \
        ref[0, 3:].tolist()


def test_lookahead_round_can_end_after_one_draft_forward(tiny_llama_pair):
    """A head that always says 'reject' stops every round after its first candidate: one draft forward and
    one candidate per round, none of them unjudged (no free token)."""
    target, draft = tiny_llama_pair
    head = lookahead_head(32, bias=-30.0)
    dec = SpeculativeDecoder(target, draft, policy="specdecpp:h=0.5,max=8", head=head)
    res = dec.generate(torch.tensor([1, 2, 3]), max_new_tokens=20, temperature=0)
    assert set(res.drafted_per_round) == {1}
    # one draft forward per candidate; every round judged its candidate but a last one capped at 1
    assert res.draft_calls == res.drafted == res.rounds and res.head_calls >= res.rounds - 1
    assert dec.policy.spec == "specdecpp:h=0.5,max=8"  # no free token for a lookahead head


def test_lookahead_head_that_always_accepts_drafts_to_the_cap(tiny_llama_pair):
    target, draft = tiny_llama_pair
    head = lookahead_head(32, bias=30.0)
    dec = SpeculativeDecoder(target, draft, policy="specdecpp:h=0.5,max=5", head=head)
    res = dec.generate(torch.tensor([1, 2, 3]), max_new_tokens=30, temperature=0)
    assert max(res.drafted_per_round) == 5
    # judged: every candidate but the one reaching the cap
    assert res.head_calls == sum(min(d, 4) for d in res.drafted_per_round)


# ------------------------------------------------------------------------------------------ exactness


@pytest.mark.parametrize("world", list(WORLDS), ids=str)
@pytest.mark.parametrize("verifier", list(VERIFIERS))
@pytest.mark.parametrize("inputs", [("state",), ("state", "logq", "entropy"), ("logq", "entropy")],
                         ids="+".join)
def test_enumeration_exact_lookahead(inputs, verifier, world):
    w = WORLDS[world]
    policy = parse_policy("specdecpp:h=0.4,max=3", head=lookahead_head(4, inputs))
    got = decoded_dist(w, policy, *VERIFIERS[verifier])
    assert abs(sum(got.values()) - 1) < 1e-12
    assert tv(got, w.target_dist()) < 1e-9


@pytest.mark.parametrize("verifier", list(VERIFIERS))
def test_enumeration_greedy_lookahead_is_the_target_argmax_path(verifier):
    w = World(vocab=4, length=4, eos=set(), greedy=True)
    got = decoded_dist(w, parse_policy("specdecpp:h=0.5,max=3", head=lookahead_head(4)), *VERIFIERS[verifier])
    target = w.target_dist()
    assert len(target) == 1 and tv(got, target) < 1e-12


@pytest.fixture(scope="module")
def peaked_pair():
    from exact_models import _peaked_llama, _perturbed

    target = _peaked_llama(12, seed=3)
    return target, _perturbed(target, 0.5, seed=4)


@pytest.mark.parametrize(("verifier", "cfg"), [("token", SamplingConfig(1.0)),
                                               ("block", SamplingConfig(0.9, top_k=6))], ids=str)
def test_chi_square_lookahead(peaked_pair, verifier, cfg):
    target, draft = peaked_pair
    head = lookahead_head(draft.config.hidden_size, ALL_INPUTS)
    dec = SpeculativeDecoder(target, draft, policy="specdecpp:h=0.5,max=3", head=head, verifier=verifier)
    prompt, n = [1, 4], 250
    counts = Counter(
        tuple(dec.generate(torch.tensor(prompt), max_new_tokens=3, temperature=cfg.temperature,
                           top_k=cfg.top_k, top_p=cfg.top_p, seed=s).new_ids.tolist())
        for s in range(n)
    )
    assert dec.policy_run.head_calls > 0
    assert _chi_square_p_value(counts, _exact_sequences(target, prompt, 3, cfg), n) > 1e-3


@pytest.mark.parametrize("verifier", ["token", "block"])
def test_greedy_lookahead_matches_transformers_generate(peaked_pair, verifier):
    target, draft = peaked_pair
    head = lookahead_head(draft.config.hidden_size, ALL_INPUTS, depth=2)
    dec = SpeculativeDecoder(target, draft, policy="specdecpp:h=0.5,max=6", head=head, verifier=verifier)
    prompt = torch.tensor([[1, 4, 7]])
    ref = target.generate(prompt, max_new_tokens=24, do_sample=False, pad_token_id=0)
    assert dec.generate(prompt, max_new_tokens=24, temperature=0).new_ids.tolist() == ref[0, 3:].tolist()


# ------------------------------------------------------------------------------- gen-data and training


@pytest.fixture(scope="module")
def lookahead_data(tiny_pair_dirs, tmp_path_factory):
    root = tmp_path_factory.mktemp("la")
    prompts = write_jsonl(root / "prompts.jsonl", PROMPTS)
    out = root / "data"
    assert gen_cli.main(base_args(tiny_pair_dirs, prompts, out, "--mix-ratio", "0.5")) == 0
    return out


def test_gen_data_writes_lookahead_states(lookahead_data, tiny_pair_dirs):
    """lookahead_features[i] is the draft's state after prompt + Z_<i: for i = 0 the state after the prompt,
    and where Z_{i-1} came from the draft it is the candidate head's feature of position i-1."""
    import datasets

    cfg = json.loads((lookahead_data / "gen_config.json").read_text())
    la, cand = np.load(lookahead_data / "lookahead_features.npy"), np.load(lookahead_data / "features.npy")
    ds = datasets.load_from_disk(str(lookahead_data))
    assert la.shape == (cfg["counts"]["positions"], cand.shape[1])
    emb = np.load(lookahead_data / "token_embeddings.npy")
    draft = acchead.models.load_causal_lm(tiny_pair_dirs[1])
    assert np.allclose(emb, draft.get_output_embeddings().weight.detach().numpy())
    start = 0
    for row in ds.select(range(4)):
        n, fd = len(row["mixed_ids"]), np.asarray(row["from_draft"])
        with torch.no_grad():
            ids = torch.tensor([row["prompt_ids"] + row["mixed_ids"]])
            states = draft(ids, output_hidden_states=True).hidden_states[-1][0].numpy()
        p = len(row["prompt_ids"])
        assert np.allclose(la[start : start + n], states[p - 1 : p - 1 + n], atol=2e-2)
        # the candidate cache row of from-draft position i equals the lookahead state of position i + 1
        ranks = np.flatnonzero(fd)
        inside = ranks[ranks + 1 < n]
        off = row["feature_offset"]
        assert np.array_equal(cand[off + np.searchsorted(ranks, inside)], la[start + inside + 1])
        start += n


@pytest.mark.parametrize("features", ["cached", "on-the-fly"])
def test_train_lookahead_head_end_to_end(lookahead_data, tiny_pair_dirs, tmp_path, features):
    out = tmp_path / "head"
    args = ["--data", str(lookahead_data), "--out", str(out), "--kind", "lookahead", "--inputs",
            "state+logq+entropy+token+topk", "--epochs", "1", "--depth", "1", "--no-progress", "--logger",
            "none", "--features", features, "--draft", str(tiny_pair_dirs[1]), "--width", "8"]
    assert train_cli.main(args) == 0
    head, meta = load_head(out / "head.safetensors")
    assert head.kind == meta.kind == "lookahead" and meta.inputs == list(ALL_INPUTS)
    assert head.width == meta.width == 8 and head.proj.out_features == 8
    data = load_gen_data(lookahead_data, "cached", kind="lookahead")
    counts = json.loads((lookahead_data / "gen_config.json").read_text())["counts"]
    assert len(data.labels) == counts["positions"]
    # the head loads into a decoder for its draft
    draft = acchead.models.load_causal_lm(tiny_pair_dirs[1])
    assert meta.draft["fingerprint"] == model_identity(draft)["fingerprint"]
    target = acchead.models.load_causal_lm(tiny_pair_dirs[0])
    dec = SpeculativeDecoder(target, draft, policy="specdecpp:h=0.5,max=4", head=out / "head.safetensors")
    with pytest.warns(UserWarning, match="labels were computed under"):
        dec.generate(torch.tensor([5, 6, 7]), max_new_tokens=8, temperature=0)


def test_train_a_head_of_the_drafts_statistics_alone(lookahead_data, tiny_pair_dirs, tmp_path):
    """`--inputs logq+entropy+topk` (no state: the real pair's demo head) trains, records its inputs, and a
    decoder for its draft runs it: greedy tokens equal autoregressive decoding's."""
    out = tmp_path / "head"
    args = ["--data", str(lookahead_data), "--out", str(out), "--inputs", "logq+entropy+topk",
            "--epochs", "2", "--depth", "1", "--width", "4", "--no-progress", "--logger", "none"]  # fmt: skip
    assert train_cli.main(args) == 0
    head, meta = load_head(out / "head.safetensors")
    assert head.inputs == tuple(meta.inputs) == ("logq", "entropy", "topk") and head.proj.in_features == 10
    target = acchead.models.load_causal_lm(tiny_pair_dirs[0])
    draft = acchead.models.load_causal_lm(tiny_pair_dirs[1])
    prompt = torch.tensor([5, 6, 7])
    ar = SpeculativeDecoder(target, draft, policy="autoregressive").generate(prompt, 12, temperature=0)
    dec = SpeculativeDecoder(target, draft, policy="specdecpp:h=0.5,max=4", head=out / "head.safetensors")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tiny data's labels were computed under another S
        got = dec.generate(prompt, 12, temperature=0)
    assert got.new_ids.tolist() == ar.new_ids.tolist() and dec.policy_run.head_calls > 0


def test_cached_and_on_the_fly_lookahead_inputs_agree(lookahead_data, tiny_pair_dirs):
    """Both feature modes hand the head the same inputs for the same positions (up to float16 states)."""
    from acchead.train.datamodule import CachedPositions, SequenceRows
    from acchead.train.draft import FrozenDraft

    cached = load_gen_data(lookahead_data, "cached", kind="lookahead")
    fly = load_gen_data(lookahead_data, "on-the-fly", kind="lookahead")
    assert np.array_equal(cached.candidate, fly.candidate) and np.array_equal(cached.labels, fly.labels)
    rows = np.arange(3)
    batch = SequenceRows(fly)[rows]
    draft = FrozenDraft.load(tiny_pair_dirs[1])
    states = draft(batch["input_ids"], batch["attention_mask"])[batch["target_mask"]]
    n = int(batch["target_mask"].sum())
    cached_feats = CachedPositions(cached)[np.arange(n)]["features"].float()
    assert torch.allclose(states, cached_feats, atol=2e-2)
    assert torch.equal(batch["candidates"][batch["target_mask"]], torch.from_numpy(cached.candidate[:n]))


def test_old_data_without_lookahead_cache_is_one_line(lookahead_data, tmp_path):
    import shutil

    old = tmp_path / "old"
    shutil.copytree(lookahead_data, old)
    cfg = json.loads((old / "gen_config.json").read_text())
    del cfg["lookahead_features"]
    (old / "gen_config.json").write_text(json.dumps(cfg))
    assert load_gen_data(old, "auto").kind == "candidate"
    with pytest.raises(AccheadError, match="before lookahead heads"):
        load_gen_data(old, "cached", kind="lookahead")
