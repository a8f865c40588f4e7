"""A feature draft that reads fused states (EAGLE-3): the outputs of some of the target's decoder layers
beside its final state. Fusing them onto a trained draft keeps its function until trained; the features
stage stores those layers' outputs after the final state; training reads and learns from them; a candidate
past a round's first (no target states) reads zeros there; a mismatch of stored and read layers is one
line."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from exact_models import _peaked_llama

from acchead.distill import cli
from acchead.distill.draft import TrainConfig, fuse_layers, init_from_target, train_draft
from acchead.distill.feature_training import feature_agreement, feature_objective, pack_feature_examples
from acchead.distill.features import load_features, shard_features, shard_sequences
from acchead.distill.responses import PlanItem, ResponsesConfig, ResponseShard, run_responses
from acchead.errors import AccheadError
from acchead.feature_chain import chain_hidden_states, target_states
from acchead.feature_draft import TargetFedDraft
from acchead.inference.batched import BatchedDecoder
from acchead.inference.decoder import SpeculativeDecoder
from acchead.inference.device_path import DevicePath
from acchead.inference.feature_drafter import FeatureDrafter
from acchead.models import load_causal_lm
from acchead.sampling import SamplingConfig

VOCAB = 12
KEPT = torch.tensor([1, 4, 7, 0, 2, 9, 11, 5])


@pytest.fixture(scope="module")
def target():
    return _peaked_llama(VOCAB, seed=3)


def _states(target, ids: list[int], layers: tuple[int, ...] = ()) -> torch.Tensor:
    """(T, W) the target's final states over `ids`, then `layers`' outputs, as the features stage stores."""
    return torch.from_numpy(shard_features(target, [ids], 10_000, bf16=False, layers=layers)[0]).float()


@torch.inference_mode()
def test_fusing_layers_keeps_the_function_and_a_chain_step_reads_zeros(target):
    draft = init_from_target(target, KEPT, (1,), feature=True).eval()
    fused = fuse_layers(draft, (0,)).eval()
    assert fused.config.fused_layers == [0] and fused.state_width == 2 * target.config.hidden_size
    assert draft.config.fused_layers == [] and draft.state_width == target.config.hidden_size
    ids = [3, 5, 1, 8, 2, 6, 4]
    states = _states(target, ids, (0,))[None]  # (1, T, 2H)
    h = target.config.hidden_size
    x = torch.tensor([ids[1:]])
    ref = draft.hidden_states(x, states[:, :-1, :h])
    torch.testing.assert_close(fused.hidden_states(x, states[:, :-1]), ref)  # new columns start at zero
    with torch.no_grad():
        fused.fc.weight[:, 2 * h :].normal_()
    moved = fused.hidden_states(x, states[:, :-1])
    assert not torch.allclose(moved, ref)  # once trained, the fused states count
    # an H-wide state (the draft's own guess, past a round's first candidate) reads zeros as fused states
    padded = torch.cat([states[:, :-1, :h], torch.zeros_like(states[:, :-1, :h])], dim=-1)
    torch.testing.assert_close(fused.hidden_states(x, states[:, :-1, :h]), fused.hidden_states(x, padded))
    # the chain feeds exactly that: depth 1 equals a forward whose later pairs read (h, zeros)
    mask = torch.ones_like(x)
    levels = chain_hidden_states(fused, x, states[:, :-1], mask, 2)
    torch.testing.assert_close(levels[0], moved)
    with pytest.raises(ValueError, match="already reads"):
        fuse_layers(fused, (1,))
    assert fuse_layers(fused, (0,)) is fused


@torch.inference_mode()
def test_stored_states_are_the_final_state_then_each_layers_output(target):
    ids = [3, 5, 1, 8, 2, 6, 4]
    plain = _states(target, ids)
    both = _states(target, ids, (0,))
    h = target.config.hidden_size
    torch.testing.assert_close(both[:, :h], plain)
    out = target.get_decoder()(input_ids=torch.tensor([ids]), output_hidden_states=True)
    torch.testing.assert_close(both[:, h:], out.hidden_states[1][0].half().float())  # layer 0's output
    with pytest.raises(AccheadError, match="below the target's last"):
        _states(target, ids, (1,))


def _trained_fused_draft(target, tmp_path, seed: int = 1) -> tuple:
    """A feature draft reading layer 0 beside the final state, trained briefly on the target's greedy text;
    (draft, its agreement before training, the run's state)."""
    g = torch.Generator().manual_seed(seed)
    shards, states = [], []
    with torch.inference_mode():
        for i in range(6):
            prompt = torch.randint(0, VOCAB, (3,), generator=g).tolist()
            seq = target.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, pad_token_id=0)
            seq = seq[0].tolist()
            shards.append(ResponseShard([i], [prompt], [seq[3:]], [False], [False]))
            states.append([shard_features(target, [seq], 10_000, bf16=False, layers=(0,))[0]])
    draft = fuse_layers(init_from_target(target, KEPT, (1,), feature=True), (0,))
    examples = pack_feature_examples(shards, states, draft.lm_head.to_draft, max_len=64)
    assert examples[0][2].shape[1] == draft.state_width
    before = feature_agreement(draft, examples, 0)
    config = TrainConfig(lr=3e-3, batch_size=3, warmup_steps=1, total_tokens=600, checkpoint_seconds=1e9)
    state = train_draft(draft, examples, examples, tmp_path, config, 0, max_seconds=60, log=lambda *_: None,
                        objective=feature_objective(noise=0.0, chain=2))  # fmt: skip
    return draft.eval(), before, state


@pytest.fixture(scope="module")
def fused_draft(target, tmp_path_factory):
    return _trained_fused_draft(target, tmp_path_factory.mktemp("fused"))


def test_training_moves_the_fused_columns_and_raises_agreement(target, fused_draft):
    draft, before, state = fused_draft
    assert draft.fc.weight[:, 2 * target.config.hidden_size :].abs().sum() > 0
    assert state["held_out_agreement"] > before


@torch.inference_mode()
def test_decoders_hand_the_draft_the_fused_states(target, fused_draft):
    """The oracle drafts exactly the candidates its teacher-forced reference (the target's fused states)
    says agree: had a decoder handed the draft the final states alone, its proposals would differ and be
    rejected. Greedy output equals the target's on both decoders; gen-data's view is the drafter's."""
    draft = fused_draft[0]
    with torch.no_grad():  # make the fused columns count, so reading zeros there would change proposals
        draft.fc.weight[:, 2 * target.config.hidden_size :] *= 4
    prompt = torch.tensor([[2, 9, 3]])
    ref = target.generate(prompt, max_new_tokens=40, do_sample=False, pad_token_id=0)[0, 3:].tolist()
    oracle = SpeculativeDecoder(target, draft, policy="oracle", fast=False)
    oracle = oracle.generate(prompt, max_new_tokens=40, temperature=0)
    assert oracle.new_ids.tolist() == ref
    assert oracle.drafted_per_round == oracle.accepted_per_round and max(oracle.accepted_per_round) >= 1
    single = SpeculativeDecoder(target, draft, policy="specdec:k=3", fast=False)
    single = single.generate(prompt, max_new_tokens=40, temperature=0)
    assert single.new_ids.tolist() == ref
    batched = BatchedDecoder(target, draft, policy="specdec:k=3")
    batched = batched.generate([prompt[0], prompt[0, :2]], max_new_tokens=40, temperature=0)
    assert batched.rows[0].new_ids.tolist() == ref
    assert batched.rows[0].accepted_per_round == single.accepted_per_round  # the same states, row by row
    # gen-data's teacher-forced view (`TargetFedDraft`) reads the same fused states as the drafter
    seq = [1, 4, 7, 2, 9, 5, 0, 3]
    h = TargetFedDraft(draft, target)(torch.tensor([seq]), output_hidden_states=True).hidden_states[-1][0]
    drafter = FeatureDrafter(draft)
    drafter.begin(torch.tensor(seq[:6]), SamplingConfig(0.0), seed=0)
    drafter.observe(target_states(target, (0,), input_ids=torch.tensor([seq[:5]]))[0], 0)
    step = drafter.propose(torch.tensor(seq[:6]), 1, want_hidden=False, want_state=True)
    torch.testing.assert_close(h[5], step.state, rtol=1e-4, atol=1e-5)
    # the target's fast path (static cache; uncompiled here, the units the compiled path traces) too
    fast = SpeculativeDecoder(target, draft, policy="specdec:k=3", fast=True, compile=False)
    fast = fast.generate(prompt, max_new_tokens=40, temperature=0)
    assert fast.new_ids.tolist() == ref and fast.accepted_per_round == single.accepted_per_round
    batched_fast = BatchedDecoder(target, draft, policy="specdec:k=3", fast=True, compile=False)
    batched_fast = batched_fast.generate([prompt[0], prompt[0, :2]], max_new_tokens=40, temperature=0)
    assert batched_fast.rows[0].accepted_per_round == single.accepted_per_round


def test_features_and_train_commands_take_fused_layers(tiny_pair_dirs, tiny_tokenizer, tmp_path, capsys):
    target_dir, _ = tiny_pair_dirs
    target = load_causal_lm(target_dir)
    plan = [PlanItem(p, False, "code") for p in ["def add(a, b):", "import os", "x = 1"]]
    config = ResponsesConfig(target="t", prompts="train", num_prompts=3, code_every=0, max_new_tokens=12,
                             max_prompt_tokens=64, shard_prompts=1, heldout_chat=0)  # fmt: skip
    run_responses(target, tiny_tokenizer, plan, tmp_path / "resp", config, batch_size=2)
    feats, plain = tmp_path / "fused", tmp_path / "plain"
    base = ["features", "--target", str(target_dir), "--responses", str(tmp_path / "resp")]
    assert cli.main([*base, "--out", str(feats / "resp"), "--fused-layers", "0"]) == 0
    assert cli.main([*base, "--out", str(plain / "resp")]) == 0
    assert cli.main([*base, "--out", str(tmp_path / "x"), "--fused-layers", "1"]) == 2  # the last layer
    assert cli.main([*base, "--out", str(tmp_path / "x"), "--fused-layers", "a"]) == 2
    assert "comma-separated" in capsys.readouterr().err
    shard = sorted((tmp_path / "resp").glob("shard-*.npz"))[0]
    ref = shard_features(target, shard_sequences(shard), 10_000, bf16=False, layers=(0,))[0]
    got = load_features(feats / "resp", shard, (0,))[0]
    assert got.shape[1] == 2 * target.config.hidden_size
    np.testing.assert_allclose(got.astype(np.float32), ref.astype(np.float32), rtol=0.05, atol=0.05)
    train = ["train", "--target", str(target_dir), "--responses", str(tmp_path / "resp"), "--out",
             str(tmp_path / "run"), "--vocab-size", "8", "--minutes", "0.05", "--held-out-shards", "1",
             "--total-tokens", "100", "--vocab-background", "0", "--features", str(feats),
             "--fused-layers", "0", "--eval", str(tmp_path / "resp")]  # fmt: skip
    assert cli.main(train) == 0 and "agreement_resp=" in capsys.readouterr().out
    draft = load_causal_lm(tmp_path / "run" / "draft")
    assert draft.config.fused_layers == [0] and draft.state_width == 2 * target.config.hidden_size
    # the states stored must be the layers the draft reads: one line naming the command that stores them
    wrong = [*train[:6], str(tmp_path / "run-2"), *train[7:]]
    wrong[wrong.index(str(feats))] = str(plain)
    assert cli.main(wrong) == 2 and "features --fused-layers 0" in capsys.readouterr().err
    # --init from the fused draft keeps its layers; asking for others is refused
    more = [*train[:6], str(tmp_path / "run-3"), *train[7:-4], *train[-2:], "--init",
            str(tmp_path / "run" / "draft"), "--new-schedule"]  # fmt: skip
    assert cli.main(more) == 0
    assert load_causal_lm(tmp_path / "run-3" / "draft").config.fused_layers == [0]
    assert cli.main([*more, "--fused-layers", "1"]) == 2 and "reads [0]" in capsys.readouterr().err
    # --target-states computes the fused states in memory (no features files), as a GPU session runs it
    online = [*train[:6], str(tmp_path / "run-on"), *train[7:]]
    online[online.index("--features") : online.index("--features") + 2] = ["--target-states"]
    assert cli.main(online) == 0 and "agreement_resp=" in capsys.readouterr().out
    assert load_causal_lm(tmp_path / "run-on" / "draft").config.fused_layers == [0]


@pytest.mark.parametrize("backend", ["cudagraphs", pytest.param("inductor", marks=pytest.mark.slow)])
def test_compiled_verification_hands_the_fused_states_over(target, fused_draft, backend):
    """Compiled units (the device path's through `cudagraphs`, uncaptured on the CPU: seconds of tracing; the
    CPU's own through Inductor, slow): transformers' hooks that collect the layers' outputs (installed
    eagerly first: their installation takes a lock no graph traces) run inside the verification's graph,
    `warm_up` prepares it, nothing compiles while decoding, and the rounds are the eager decoder's; the
    batched fast path's too."""
    prompt = torch.tensor([2, 9, 3])
    path = DevicePath(True, backend="cudagraphs") if backend == "cudagraphs" else None
    # a model's compiled runner serves one path: each backend compiles its own copy of the target, a fresh
    # one (the same seeded weights) whose first forward asking for layers' outputs is the compiled one, and
    # of the draft (the module's, compiled for the other backend where the whole suite runs, is refused)
    compiled, draft = _peaked_llama(VOCAB, seed=3), copy.deepcopy(fused_draft[0])
    dec = SpeculativeDecoder(compiled, draft, policy="specdec:k=3", fast=True, device_path=path)
    dec.warm_up(prompt.numel() + 24)
    with torch.compiler.set_stance("fail_on_recompile"):
        got = dec.generate(prompt, max_new_tokens=24, temperature=0)
    eager = SpeculativeDecoder(target, draft, policy="specdec:k=3", fast=False)
    ref = eager.generate(prompt, max_new_tokens=24, temperature=0)
    assert got.new_ids.tolist() == ref.new_ids.tolist() and got.accepted_per_round == ref.accepted_per_round
    if backend == "cudagraphs":  # the batched fast path's compiled units, on another fresh copy
        batched = BatchedDecoder(_peaked_llama(VOCAB, seed=3), draft, policy="specdec:k=3", fast=True,
                                 device_path=path, single=False)  # fmt: skip
        batched.warm_up(1, prompt.numel() + 24)
        rows = batched.generate([prompt], max_new_tokens=24, temperature=0).rows
        assert rows[0].accepted_per_round == ref.accepted_per_round
