"""The feature (EAGLE) draft: its KV-cached drafting equals a full forward over the same pairs, decoding
with it stays exact (greedy-identical, chi-square under sampling), and its training stages run end to
end (features → train → a draft directory that loads and decodes)."""

from __future__ import annotations

import json
import shutil
from collections import Counter

import numpy as np
import pytest
import torch
from exact_models import _chi_square_p_value, _exact_sequences, _peaked_llama

from acchead.distill import cli
from acchead.distill.draft import IGNORE, TrainConfig, init_from_target, train_draft
from acchead.distill.feature_training import (
    collate_features,
    feature_agreement,
    feature_loss,
    feature_objective,
    pack_feature_examples,
    pack_teacher_features,
)
from acchead.distill.features import load_features, run_features, shard_features, shard_sequences
from acchead.distill.responses import PlanItem, ResponsesConfig, ResponseShard, run_responses
from acchead.distill.train_stage import _states_reader
from acchead.errors import AccheadError
from acchead.feature_draft import FeatureDraftForCausalLM, TargetFedDraft, is_feature_draft
from acchead.head import AcceptanceHead
from acchead.inference.decoder import SpeculativeDecoder
from acchead.inference.feature_drafter import FeatureDrafter
from acchead.models import load_causal_lm
from acchead.sampling import SamplingConfig

VOCAB = 12
KEPT = torch.tensor([1, 4, 7, 0, 2, 9, 11, 5])  # the draft's head rows; 3, 6, 8, 10 it cannot propose


def _feature_draft(target, seed: int = 5, noise: float = 0.3) -> FeatureDraftForCausalLM:
    """A feature draft started from the target's last layer, its weights jittered (so it disagrees
    sometimes)."""
    draft = init_from_target(target, KEPT, (1,), feature=True).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            if p.requires_grad:
                p.add_(noise * p.std() * torch.randn(p.shape, generator=g))
    return draft


def _states(target, ids: list[int]) -> torch.Tensor:
    """(T, H) the target's final hidden states over `ids`."""
    return target.get_decoder()(input_ids=torch.tensor([ids])).last_hidden_state[0]


def _greedy_text(target, count: int, seed: int = 0) -> tuple[list[ResponseShard], list[list[np.ndarray]]]:
    """`count` one-response shards of the target's greedy continuations of random 3-token prompts, with
    the target's states over them."""
    g = torch.Generator().manual_seed(seed)
    shards, states = [], []
    with torch.inference_mode():
        for i in range(count):
            prompt = torch.randint(0, VOCAB, (3,), generator=g).tolist()
            full = target.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, pad_token_id=0)
            seq = full[0].tolist()
            shards.append(ResponseShard([i], [prompt], [seq[3:]], [False], [False]))
            states.append([_states(target, seq).numpy().astype(np.float16)])
    return shards, states


@pytest.fixture(scope="module")
def feature_pair(tmp_path_factory):
    return trained_feature_pair(tmp_path_factory)


def trained_feature_pair(tmp_path_factory) -> tuple:
    """The target and a feature draft trained briefly on its greedy text (so candidates get accepted)."""
    target = _peaked_llama(VOCAB, seed=3)
    draft = _feature_draft(target)
    examples = pack_feature_examples(*_greedy_text(target, 16), draft.lm_head.to_draft, max_len=64)
    config = TrainConfig(lr=3e-3, batch_size=8, warmup_steps=1, total_tokens=4000, checkpoint_seconds=1e9)
    train_draft(draft, examples, [], tmp_path_factory.mktemp("draft"), config, 0, max_seconds=30,
                log=lambda *_: None, objective=feature_objective(noise=0.0))  # fmt: skip
    return target, draft.eval()


@torch.inference_mode()
def test_cached_drafting_equals_a_full_forward_over_the_same_pairs(feature_pair):
    target, draft = feature_pair
    drafter = FeatureDrafter(draft)
    prompt = [1, 4, 7, 2, 9]
    drafter.begin(torch.tensor(prompt), SamplingConfig(0.0), seed=0)
    assert not drafter.ready
    drafter.observe(_states(target, prompt[:-1]), 0)  # a round starts with n - 1 states known
    assert drafter.ready

    def full(ids: list[int], feats: torch.Tensor) -> torch.Tensor:  # the last pair's h, no cache
        return draft.hidden_states(torch.tensor([ids]), feats[None])[0, -1]

    ctx = torch.tensor(prompt)
    s1 = drafter.propose(ctx, 1, want_hidden=False, want_state=True)
    f = _states(target, prompt)
    h1 = full(prompt[1:], f[:-1])
    torch.testing.assert_close(s1.state, h1, rtol=1e-4, atol=1e-5)
    assert int(s1.token) == int(draft.lm_head(h1).argmax())
    # candidate 2 reads the draft's own h in place of the target's state at the newest position
    ctx2 = torch.cat([ctx, s1.token.view(1)])
    s2 = drafter.propose(ctx2, 2, want_hidden=False, want_state=True)
    h2 = full([*prompt[1:], int(s1.token)], torch.cat([f[:-1], h1[None]]))
    torch.testing.assert_close(s2.state, h2, rtol=1e-4, atol=1e-5)
    # verification accepts the first candidate and adds token 3: the next round reads true states only
    drafter.rollback(len(prompt) + 1)
    accepted = [*prompt, int(s1.token)]
    drafter.observe(_states(target, accepted)[len(prompt) - 1 :], len(prompt) - 1)
    committed = [*accepted, 3]
    s3 = drafter.propose(torch.tensor(committed), 1, want_hidden=True, want_state=True)
    f3 = _states(target, accepted)
    torch.testing.assert_close(s3.state, full(committed[1:], f3), rtol=1e-4, atol=1e-5)
    # want_hidden fed the candidate with its own h: that step's h draws candidate 2
    h_fed = full([*committed[1:], int(s3.token)], torch.cat([f3, s3.state[None]]))
    torch.testing.assert_close(s3.hidden, h_fed, rtol=1e-4, atol=1e-5)
    assert drafter.draft_calls == 4


@pytest.mark.parametrize("spec", ["specdec:k=4", "specdecpp:h=0.5,max=6", "confidence:tau=0.6,max=8"])
def test_greedy_equals_the_targets_greedy(feature_pair, spec):
    target, draft = feature_pair
    dec = SpeculativeDecoder(target, draft, policy=spec, head=AcceptanceHead(32, depth=1), fast=False)
    assert isinstance(dec.drafter, FeatureDrafter)
    prompt = torch.tensor([[1, 4, 7]])
    ref = target.generate(prompt, max_new_tokens=24, do_sample=False, pad_token_id=0)
    res = dec.generate(prompt, max_new_tokens=24, temperature=0)
    assert res.new_ids.tolist() == ref[0, 3:].tolist()
    assert res.accepted_per_round[0] == 0 and res.drafted_per_round[0] == 0  # the first round: the target
    assert sum(res.accepted_per_round) > 0  # the draft's candidates do get accepted


def test_autoregressive_decoding_leaves_the_feature_drafter_alone(feature_pair, monkeypatch):
    """AR never drafts: it asks the target for no states and never feeds or warms up the draft (its speed is
    the baseline every speedup divides by), and it decodes the target's greedy tokens."""
    target, draft = feature_pair
    dec = SpeculativeDecoder(target, draft, policy="autoregressive", fast=False)

    def refuse(*args, **kwargs):
        raise AssertionError("autoregressive decoding touched the drafter")

    for name in ("begin", "observe", "warm_up", "propose"):
        monkeypatch.setattr(dec.drafter, name, refuse)
    prompt = torch.tensor([[1, 4, 7]])
    dec.warm_up(64)
    res = dec.generate(prompt, max_new_tokens=12, temperature=0)
    ref = target.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert res.new_ids.tolist() == ref[0, 3:].tolist() and res.draft_calls == 0


def test_the_drafters_states_grow_in_place_across_rounds(feature_pair):
    """The committed positions' states live in a buffer that doubles: a long decode (its buffer regrown
    several times) decodes what the target's greedy decoding does, and holds exactly the committed rows."""
    target, draft = feature_pair
    dec = SpeculativeDecoder(target, draft, policy="specdec:k=3", fast=False)
    prompt = torch.tensor([[2, 9, 3]])
    res = dec.generate(prompt, max_new_tokens=48, temperature=0)
    ar = SpeculativeDecoder(target, draft, policy="autoregressive", fast=False)  # long: float ties vs HF's
    assert res.new_ids.tolist() == ar.generate(prompt, max_new_tokens=48, temperature=0).new_ids.tolist()
    full = torch.cat([prompt[0], res.new_ids])
    known, width = dec.drafter._known, target.config.hidden_size
    assert known >= full.numel() - 4 and dec.drafter._states.shape[0] >= known
    torch.testing.assert_close(dec.drafter._states[:known, :width], _states(target, full.tolist())[:known],
                               rtol=1e-4, atol=1e-4)  # fmt: skip


def test_the_oracle_of_a_feature_draft_never_drafts_a_rejected_candidate(feature_pair):
    """The hindsight bound reads each candidate at its depth: every drafted token is accepted, runs past
    the first candidate included (with first-candidate agreement alone, later ones would be rejected)."""
    target, draft = feature_pair
    prompt = torch.tensor([[2, 9, 3]])
    ar = SpeculativeDecoder(target, draft, policy="autoregressive", fast=False)
    ref = ar.generate(prompt, max_new_tokens=60, temperature=0).new_ids  # a 60-token decode meets float ties
    dec = SpeculativeDecoder(target, draft, policy="oracle", fast=False)  # with HF's: compare our own
    res = dec.generate(prompt, max_new_tokens=60, temperature=0)
    assert res.new_ids.tolist() == ref.tolist()
    assert res.drafted_per_round == res.accepted_per_round
    assert max(res.accepted_per_round) >= 2, res.accepted_per_round
    reference = dec._reference(prompt[0], 60, set())  # agree[k][i], one level per depth its runs reach
    assert len(reference) >= 2 and reference[0] != reference[1]  # depth changes what the draft proposes


@pytest.mark.parametrize(("spec", "verifier"), [("specdec:k=2", "token"), ("specdecpp:h=0.5,max=3", "block")])
def test_sampling_stays_exact(feature_pair, spec, verifier):
    target, draft = feature_pair
    dec = SpeculativeDecoder(target, draft, policy=spec, head=AcceptanceHead(32, depth=1), verifier=verifier,
                             fast=False)  # fmt: skip
    cfg, prompt, n = SamplingConfig(1.0), [1, 4], 250
    exact = _exact_sequences(target, prompt, 3, cfg)
    counts = Counter(
        tuple(dec.generate(torch.tensor(prompt), max_new_tokens=3, temperature=1.0, seed=s).new_ids.tolist())
        for s in range(n)
    )
    assert _chi_square_p_value(counts, exact, n) > 1e-3


def test_the_default_path_is_eager_and_a_plain_forward_is_refused(feature_pair):
    target, draft = feature_pair
    # the device's default path (the fast one on CUDA, forced here) stays eager for a feature draft (its
    # fast path, tests/test_feature_fast_path.py, is opt-in)
    assert not SpeculativeDecoder(target, draft, policy="specdec:k=2", device_path=True).fast
    with pytest.raises(TypeError, match="hidden_states"):
        draft(input_ids=torch.tensor([[1, 2]]))
    assert is_feature_draft(draft) and not is_feature_draft(target)


def test_examples_pair_each_token_with_the_state_before_it():
    shard = ResponseShard([0], [[1, 4, 7]], [[2, 3, 9, 5]], [False], [True])
    states = [np.arange(7 * 2, dtype=np.float16).reshape(7, 2)]
    (ids, labels, f), = pack_feature_examples([shard], [states], torch.arange(VOCAB), max_len=64)
    assert ids.tolist() == [4, 7, 2, 3, 9, 5]  # pair j reads t_{j+1}
    # pair j's label is t_{j+2} from the first response token on: 2 (j=1), 3, 9, 5; the last pair has none
    assert labels.tolist() == [IGNORE, 2, 3, 9, 5, IGNORE]
    _, mask, labels_b, read, target = collate_features([(ids, labels, f)], pad_id=0)
    assert torch.equal(read[0, 0], torch.tensor([0.0, 1.0]))  # pair 0 reads f_0, regresses f_1
    assert torch.equal(target[0, 0], torch.tensor([2.0, 3.0]))
    assert mask.sum() == 6 and torch.equal(labels_b[0], labels)


@pytest.mark.parametrize(("soft", "chain"), [(False, 1), (True, 1), (False, 3)],
                         ids=["greedy-token", "soft-labels", "chain"])  # fmt: skip
def test_training_lowers_the_loss_and_raises_agreement(feature_pair, tmp_path, soft, chain):
    target, _ = feature_pair
    draft = init_from_target(target, KEPT, (1,), feature=True)
    rows = target.get_output_embeddings().weight.detach()[KEPT] if soft else None
    examples = pack_feature_examples(*_greedy_text(target, 4, seed=1), draft.lm_head.to_draft, max_len=64)
    batch = collate_features(examples, pad_id=0)
    before = feature_loss(draft, batch, noise=0.0, teacher_rows=rows, chain=chain)[0].item()
    agree0 = feature_agreement(draft, examples, 0)
    config = TrainConfig(lr=3e-3, batch_size=4, warmup_steps=1, total_tokens=400, checkpoint_seconds=1e9)
    state = train_draft(draft, examples, examples, tmp_path, config, 0, max_seconds=60, log=lambda *_: None,
                        objective=feature_objective(noise=0.0, teacher_rows=rows, chain=chain))  # fmt: skip
    assert feature_loss(draft, batch, noise=0.0, teacher_rows=rows, chain=chain)[0].item() < before
    assert state["held_out_agreement"] > agree0


def test_features_and_train_commands_end_to_end(tiny_pair_dirs, tiny_tokenizer, tmp_path, capsys):
    target_dir, _ = tiny_pair_dirs
    target = load_causal_lm(target_dir)
    texts = ["def add(a, b):", "for i in range(3):", "import os", "x = 1"]
    plan = [PlanItem(p, False, "code") for p in texts]
    config = ResponsesConfig(target="t", prompts="train", num_prompts=4, code_every=0, max_new_tokens=16,
                             max_prompt_tokens=64, shard_prompts=1, heldout_chat=0)  # fmt: skip
    run_responses(target, tiny_tokenizer, plan, tmp_path / "resp", config, batch_size=2)
    feats = tmp_path / "feats"
    argv = ["features", "--target", str(target_dir), "--responses", str(tmp_path / "resp"),
            "--out", str(feats / "resp"), "--batch-tokens", "40"]  # fmt: skip
    assert cli.main(argv) == 0
    assert "shards_written=4" in capsys.readouterr().out
    assert cli.main(argv) == 0 and "shards_written=0" in capsys.readouterr().out  # resumes: nothing left
    # the stored states are the target's, float16, batching and padding aside
    shard = sorted((tmp_path / "resp").glob("shard-*.npz"))[0]
    ref = shard_features(target, shard_sequences(shard), batch_tokens=10_000, bf16=False)[0]
    got = load_features(feats / "resp", shard)[0]
    np.testing.assert_allclose(got.astype(np.float32), ref.astype(np.float32), rtol=0.05, atol=0.05)
    train = ["train", "--target", str(target_dir), "--responses", str(tmp_path / "resp"), "--out",
             str(tmp_path / "run"), "--vocab-size", "16", "--minutes", "0.05", "--held-out-shards", "1",
             "--total-tokens", "100", "--vocab-background", "0", "--features", str(feats),
             "--eval", str(tmp_path / "resp")]  # fmt: skip
    assert cli.main(train) == 0
    out = capsys.readouterr().out
    assert "held_out_agreement=" in out and "agreement_resp=" in out
    draft = load_causal_lm(tmp_path / "run" / "draft")
    assert is_feature_draft(draft) and draft.config.num_hidden_layers == 1  # --layers defaults to the last
    assert json.loads((tmp_path / "run" / "progress.json").read_text())["tokens"] >= 100
    # and it decodes the target exactly
    dec = SpeculativeDecoder(target, draft, policy="specdec:k=3", fast=False)
    prompt = torch.tensor([[5, 6, 7]])
    ref_ids = target.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)[0, 3:]
    assert dec.generate(prompt, max_new_tokens=12, temperature=0).new_ids.tolist() == ref_ids.tolist()
    # teacher exchanges (here the target's own responses, so their argmax labels are the responses' next
    # tokens): `features --teacher` stores their states, and `train --teacher` packs them beside the
    # responses, each pair labelled as `pack_feature_examples` labels the same text
    from acchead.distill.responses import load_responses
    from acchead.distill.teacher import TeacherConfig, load_teacher, run_teacher

    resp = load_responses(tmp_path / "resp")
    exchanges = [(p + r, len(p)) for sh in resp for p, r in zip(sh.prompts, sh.responses, strict=True)]
    tconfig = TeacherConfig(target="t", num_exchanges=len(exchanges), max_len=64, shard_exchanges=2)
    run_teacher(target, tiny_tokenizer, exchanges, tmp_path / "teacher", tconfig, batch_size=2)
    tfeat = ["features", "--target", str(target_dir), "--teacher", str(tmp_path / "teacher"),
             "--out", str(feats / "teacher")]  # fmt: skip
    assert cli.main(tfeat) == 0 and "shards_written=2" in capsys.readouterr().out
    assert cli.main([*tfeat[:4], str(tmp_path / "feats"), *tfeat[5:]]) == 2  # no shards there: one line
    assert "no response or teacher shards" in capsys.readouterr().err
    teacher = load_teacher(tmp_path / "teacher")
    tstates = [load_features(feats / "teacher", p) for p in sorted((tmp_path / "teacher").glob("teacher-*"))]
    to_draft = torch.arange(len(tiny_tokenizer))
    packed = pack_teacher_features(teacher, tstates, to_draft, 64)
    rstates = [load_features(feats / "resp", p) for p in sorted((tmp_path / "resp").glob("shard-*"))]
    ref = pack_feature_examples(resp, rstates, to_draft, 64)
    assert len(packed) == len(ref) == 4
    for (ids, lab, f), (rids, rlab, rf) in zip(packed, ref, strict=True):
        assert ids.tolist() == rids.tolist() and torch.equal(f, rf)
        assert lab[:-1].tolist() == rlab[:-1].tolist()  # the last pair: only the teacher knows its label
        assert rlab[-1] == IGNORE and lab[-1] >= 0
    with_teacher = [*train[:6], str(tmp_path / "run-t"), *train[7:], "--teacher", str(tmp_path / "teacher")]
    assert cli.main(with_teacher) == 0
    assert "train_examples=7" in capsys.readouterr().out  # 3 training response shards + 4 exchanges
    shutil.copytree(tmp_path / "teacher", tmp_path / "teacher-2")  # no states stored for this one
    assert cli.main([*with_teacher[:-1], str(tmp_path / "teacher-2")]) == 2
    assert "acchead-distill features" in capsys.readouterr().err
    # soft labels: the target's distribution at every position, a new schedule from the run's draft (its own
    # schedule has ended: going on with it would train nothing, and is refused)
    soft = [*train[:6], str(tmp_path / "run-soft"), *train[7:], "--init", str(tmp_path / "run" / "draft"),
            "--new-schedule", "--soft-labels", "--chain", "3", "--cls-weight", "0.5"]  # fmt: skip
    assert cli.main(soft) == 0
    out = capsys.readouterr().out
    assert "agreement_resp=" in out and "agreement_by_depth_resp=" in out
    assert cli.main([*train[:-4], "--cls-weight", "0.5"]) == 2  # without --features
    assert "train a feature draft" in capsys.readouterr().err
    # --target-states: the target's states computed when the stage starts, no features stage, no files;
    # the same loaded target gives the soft labels' rows
    on = ["--target-states", "--soft-labels"]
    online = [*train[:6], str(tmp_path / "run-on"), *train[7:-4], *on, *train[-2:]]
    assert cli.main(online) == 0 and "agreement_resp=" in (out := capsys.readouterr().out)
    assert "train_examples=3" in out
    read = _states_reader(None, target, ())
    np.testing.assert_allclose(read(tmp_path / "resp", [shard])[0][0].astype(np.float32),
                               got.astype(np.float32), rtol=0.05, atol=0.05)  # fmt: skip
    assert cli.main([*train, "--target-states"]) == 2 and "two sources" in capsys.readouterr().err
    with pytest.raises(AccheadError, match="features"):
        load_features(tmp_path / "nowhere", shard)
    assert run_features(target, tmp_path / "resp", feats / "resp")["shards_written"] == 0


@torch.inference_mode()
def test_teacher_forced_states_are_the_first_candidates_of_a_round(feature_pair):
    """`TargetFedDraft` (gen-data's view) gives, at position i, the state from which the
    drafter draws a round's first candidate after seq[: i + 1]; left padding changes nothing."""
    target, draft = feature_pair
    seq = [1, 4, 7, 2, 9, 5, 0, 3]
    fed = TargetFedDraft(draft, target)
    h = fed(torch.tensor([seq]), output_hidden_states=True).hidden_states[-1][0]  # (T, H)
    drafter = FeatureDrafter(draft)
    for i in (2, 5, 7):
        drafter.begin(torch.tensor(seq[: i + 1]), SamplingConfig(0.0), seed=0)
        drafter.observe(_states(target, seq[:i]), 0)
        step = drafter.propose(torch.tensor(seq[: i + 1]), 1, want_hidden=False, want_state=True)
        torch.testing.assert_close(h[i], step.state, rtol=1e-4, atol=1e-5)
    padded = torch.tensor([[0, 0, *seq[:6]], seq])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1], [1] * 8])
    out = fed(padded, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0), logits_to_keep=4)
    torch.testing.assert_close(out.logits[0, -4:], fed(torch.tensor([seq[:6]])).logits[0, -4:], rtol=1e-4,
                               atol=1e-4)  # fmt: skip


def test_features_autocast_in_bfloat16_only_where_the_hardware_computes_in_it(
    tiny_pair_dirs, tiny_tokenizer, tmp_path, capsys, monkeypatch
):
    """`features --dtype auto` (the default): bfloat16 autocast on a GPU or a CPU with AMX or AVX-512 BF16,
    float32 elsewhere (emulated bfloat16 ran 63 positions/s against 424 on an AVX2-only CPU); --dtype
    forces either, and the summary says which ran."""
    from acchead.models import native_bfloat16

    for amx, avx512_bf16 in [(False, False), (True, False), (False, True)]:
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda v=amx: v, raising=False)
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=avx512_bf16: v, raising=False)
        assert native_bfloat16(torch.device("cpu")) == (amx or avx512_bf16)
    assert native_bfloat16(torch.device("cuda")) and not native_bfloat16(torch.device("meta"))
    # a CPU with neither (CI's may have one)
    for probe in ("_is_amx_tile_supported", "_is_avx512_bf16_supported"):
        monkeypatch.setattr(torch.cpu, probe, lambda: False, raising=False)
    target_dir, _ = tiny_pair_dirs
    plan = [PlanItem(p, False, "code") for p in ["def add(a, b):", "x = 1"]]
    config = ResponsesConfig(target="t", prompts="train", num_prompts=2, code_every=0, max_new_tokens=8,
                             max_prompt_tokens=64, shard_prompts=1, heldout_chat=0)  # fmt: skip
    run_responses(load_causal_lm(target_dir), tiny_tokenizer, plan, tmp_path / "resp", config, batch_size=2)
    base = ["features", "--target", str(target_dir), "--responses", str(tmp_path / "resp")]
    for flag, want in [([], "float32"), (["--dtype", "bfloat16"], "bfloat16")]:
        assert cli.main([*base, "--out", str(tmp_path / want), *flag]) == 0
        assert f"dtype={want}" in capsys.readouterr().out
