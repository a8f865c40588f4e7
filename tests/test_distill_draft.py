"""The draft's vocabulary, its start from the target (exactly the target on the kept tokens when given all
its layers), its labels, and training that lowers the loss, checkpoints, resumes and exports a draft
directory; `acchead-distill train` end to end on a tiny target."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
from conftest import make_tiny_llama

from acchead.distill import cli
from acchead.distill.draft import (
    IGNORE,
    OUTSIDE,
    TrainConfig,
    agreement,
    build_vocabulary,
    collate,
    coverage,
    grow_layers,
    grow_vocabulary,
    init_from_target,
    pack_examples,
    train_draft,
)
from acchead.distill.responses import PlanItem, ResponsesConfig, ResponseShard, run_responses
from acchead.errors import AccheadError
from acchead.models import load_causal_lm

SHARD = ResponseShard(
    plan_index=[0, 1], prompts=[[5, 6, 7], [8, 9]], responses=[[10, 11, 10, 3], [11, 12, 3]],
    chat=[False, False], ended=[True, True],
)  # fmt: skip


def test_vocabulary_ranks_by_frequency_after_the_fixed_ids():
    vocab = build_vocabulary([SHARD], 3, always=(3,))
    assert vocab.tolist() == [3, 10, 11]  # 3 first; then 10 (x2) and 11 (x2), ties by id
    assert coverage([SHARD], vocab) == pytest.approx(6 / 7)
    assert build_vocabulary([SHARD], 9).tolist() == [3, 10, 11, 12, 5, 6, 7, 8, 9]  # then prompt ids
    background = Counter({40: 5, 41: 9})  # other assistant text ranks unseen tokens before the prompts'
    assert build_vocabulary([SHARD], 6, background=background).tolist() == [3, 10, 11, 12, 41, 40]
    with pytest.raises(ValueError, match="fewer than the 10"):
        build_vocabulary([SHARD], 10)


def test_draft_with_all_layers_is_the_target_on_its_vocabulary():
    target = make_tiny_llama(64, hidden_size=32, num_layers=3, seed=0)
    ids = torch.tensor([[1, 5, 9, 2, 33, 5]])
    vocab = torch.tensor(sorted(set(ids[0].tolist()) | {40, 41, 42}))
    draft = init_from_target(target, vocab, (0, 1, 2)).eval()
    with torch.no_grad():
        ours, theirs = draft(input_ids=ids).logits, target(input_ids=ids).logits
    assert torch.allclose(ours[..., vocab], theirs[..., vocab], atol=1e-5)
    short = init_from_target(target, vocab, (0, 2))
    assert short.config.num_hidden_layers == 2
    assert torch.equal(short.model.layers[1].mlp.up_proj.weight, target.model.layers[2].mlp.up_proj.weight)


def _move_extras(model):
    """`model` with its biases and per-head q / k norms off the zeros and ones they start at (a draft that
    dropped one would then differ)."""
    with torch.no_grad():
        for name, prm in model.named_parameters():
            if name.endswith(".bias"):
                prm.normal_(0, 0.5)
            elif name.endswith(("q_norm.weight", "k_norm.weight")):
                prm.normal_(1, 0.5)
    return model


def test_a_llama_target_with_biases_gives_a_draft_with_them():
    """A Llama target may have biases in its attention and MLP (`attention_bias`, `mlp_bias`): the draft
    of all its layers has them too, and is the target on its vocabulary."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, attention_bias=True, mlp_bias=True, bos_token_id=0,
                      eos_token_id=0, pad_token_id=0, tie_word_embeddings=True)  # fmt: skip
    torch.manual_seed(0)
    target = _move_extras(LlamaForCausalLM(cfg).eval())
    ids, vocab = torch.tensor([[1, 5, 9, 2, 33, 5]]), torch.arange(0, 64, 2)
    draft = init_from_target(target, vocab, (0, 1)).eval()
    assert draft.config.attention_bias and draft.config.mlp_bias
    with torch.no_grad():
        ours, theirs = draft(input_ids=ids).logits, target(input_ids=ids).logits
    torch.testing.assert_close(ours[..., vocab], theirs[..., vocab])


def _tiny_qwen(kind: str, num_layers: int, vocab_size: int = 64, eos: int = 0):
    """A random Qwen 2 or Qwen 3 target whose attention's extras are not their initial values: Qwen 2's
    biases of q, k and v and Qwen 3's per-head norms of q and k (their initialisers give zeros and ones)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    classes = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM)}
    config_cls, model_cls = classes[kind]
    cfg = config_cls(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_attention_heads=4, head_dim=8,
        num_hidden_layers=num_layers, num_key_value_heads=2, tie_word_embeddings=True, bos_token_id=eos,
        eos_token_id=eos, pad_token_id=eos,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return _move_extras(model_cls(cfg).eval())


@pytest.mark.parametrize("kind", ["qwen2", "qwen3"])
@pytest.mark.parametrize("feature", [False, True])
def test_a_qwen_target_starts_a_draft_of_its_own_layers(kind, feature, tmp_path):
    """Qwen 2's layers are Llama's but for the biases of q, k and v, Qwen 3's but for its per-head norms of q
    and k: a draft of all its layers is the target on its vocabulary (o_proj's bias, which Qwen 2 lacks,
    starts at zero), it saves and loads, and a grown draft whose last layer has trained off its copy (o_proj's
    bias, the norms) still starts as the same function."""
    target = _tiny_qwen(kind, 3)
    ids, vocab = torch.tensor([[1, 5, 9, 2, 33, 5]]), torch.arange(0, 64, 2)
    target.save_pretrained(tmp_path / "target")
    draft = init_from_target(target, vocab, (0, 1, 2), str(tmp_path / "target"), feature=feature).eval()
    mine, theirs = draft.model.layers[1].self_attn, target.model.layers[1].self_attn
    if kind == "qwen2":
        assert draft.config.attention_bias and not draft.model.layers[0].self_attn.o_proj.bias.any()
        assert torch.equal(mine.q_proj.bias, theirs.q_proj.bias)
    else:
        assert draft.config.qk_norm and not draft.config.attention_bias
        assert torch.equal(mine.k_norm.weight, theirs.k_norm.weight)
    feats = torch.randn(1, 6, 32)
    with torch.no_grad():
        if not feature:
            ours, theirs = draft(input_ids=ids).logits, target(input_ids=ids).logits
            torch.testing.assert_close(ours[..., vocab], theirs[..., vocab])
        last = draft.model.layers[-1].self_attn  # as training would move it
        (last.o_proj.bias if kind == "qwen2" else last.q_norm.weight).normal_()
        out = (lambda m: m.hidden_states(ids, feats)) if feature else (lambda m: m(input_ids=ids).logits)
        torch.testing.assert_close(out(grow_layers(draft, 1).eval()), out(draft))
    draft.save_pretrained(tmp_path / "draft")
    loaded = load_causal_lm(tmp_path / "draft").eval()
    assert (loaded.config.attention_bias, loaded.config.qk_norm) == (kind == "qwen2", kind == "qwen3")
    with torch.no_grad():
        torch.testing.assert_close(out(loaded), out(draft))


def test_a_target_whose_layers_are_not_llamas_is_one_line():
    """The draft starts from copies of the target's layers: a target of another layout (Phi 3's fused
    projections) is refused in one line naming it, not a state-dict traceback."""
    from transformers import Phi3Config, Phi3ForCausalLM

    cfg = Phi3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                     num_attention_heads=4, num_key_value_heads=2, bos_token_id=0, eos_token_id=0,
                     pad_token_id=0)  # fmt: skip
    with pytest.raises(AccheadError, match=r"Llama-layout target .* this one is 'phi3'"):
        init_from_target(Phi3ForCausalLM(cfg), torch.arange(8), (0,))


@pytest.mark.parametrize("feature", [False, True])
def test_a_grown_draft_starts_as_the_same_function_and_its_new_layers_learn(feature):
    target = make_tiny_llama(64, hidden_size=32, num_layers=2, seed=0)
    draft = init_from_target(target, torch.arange(40), (1,), feature=feature).eval()
    grown = grow_layers(draft, 2).eval()
    assert grown.config.num_hidden_layers == 3 and draft.config.num_hidden_layers == 1  # the draft kept
    ids, feats = torch.tensor([[1, 5, 9, 2, 33, 5]]), torch.randn(1, 6, 32)
    with torch.no_grad():
        if feature:
            ours, theirs = grown.hidden_states(ids, feats), draft.hidden_states(ids, feats)
        else:
            ours, theirs = grown(input_ids=ids).logits, draft(input_ids=ids).logits
    torch.testing.assert_close(ours, theirs)
    new = grown.model.layers[1]
    assert not new.self_attn.o_proj.weight.any() and not new.mlp.down_proj.weight.any()
    assert torch.equal(new.mlp.up_proj.weight, draft.model.layers[0].mlp.up_proj.weight)
    assert not grown.get_input_embeddings().weight.requires_grad
    out = grown.hidden_states(ids, feats) if feature else grown(input_ids=ids).logits
    out.square().sum().backward()
    assert new.mlp.down_proj.weight.grad.abs().sum() > 0  # the zeroed projections move first
    with pytest.raises(ValueError, match="count"):
        grow_layers(draft, 0)


@pytest.mark.parametrize("feature", [False, True])
def test_a_grown_vocabulary_keeps_the_old_rows_and_maps_the_new_ones(feature):
    """New head rows come after the old ones, each the least-squares map of its embedding row; the old
    tokens' logits are unchanged, q is still zero outside the head, and the new rows train."""
    target = make_tiny_llama(64, hidden_size=32, num_layers=2, seed=0)
    draft = init_from_target(target, torch.arange(0, 80, 2)[:32], (1,), feature=feature).eval()
    with torch.no_grad():  # trained rows that have drifted from the target's: a map to find
        draft.lm_head.weight.add_(0.05 * torch.randn_like(draft.lm_head.weight))
    new_ids = torch.tensor([1, 3, 5])
    grown = grow_vocabulary(draft, new_ids).eval()
    assert grown.config.draft_vocab_size == 35 and draft.config.draft_vocab_size == 32  # the draft kept
    assert grown.lm_head.to_full.tolist() == [*draft.lm_head.to_full.tolist(), 1, 3, 5]
    assert grown.lm_head.to_draft[new_ids].tolist() == [32, 33, 34] and grown.lm_head.to_draft[7] == -1
    emb = draft.get_input_embeddings().weight.detach()
    mapping = torch.linalg.lstsq(emb[draft.lm_head.to_full], draft.lm_head.weight.detach()).solution
    torch.testing.assert_close(grown.lm_head.weight[32:].detach(), emb[new_ids] @ mapping)
    ids, feats = torch.tensor([[1, 5, 9, 2, 33, 5]]), torch.randn(1, 6, 32)
    with torch.no_grad():
        if feature:
            h_old, h_new = draft.hidden_states(ids, feats), grown.hidden_states(ids, feats)
            ours, theirs = grown.lm_head(h_new), draft.lm_head(h_old)
        else:
            ours, theirs = grown(input_ids=ids).logits, draft(input_ids=ids).logits
    old = draft.lm_head.to_full
    torch.testing.assert_close(ours[..., old], theirs[..., old])
    assert torch.isfinite(ours[..., new_ids]).all() and ours[..., 7].isinf().all()  # q = 0 outside
    assert not grown.get_input_embeddings().weight.requires_grad
    grown.lm_head(torch.randn(2, 32))[:, new_ids].sum().backward()
    assert grown.lm_head.weight.grad[32:].abs().sum() > 0  # the new rows train
    for bad in (torch.tensor([1, 1]), torch.tensor([0]), torch.tensor([], dtype=torch.long)):
        with pytest.raises(ValueError):
            grow_vocabulary(draft, bad)


def test_labels_cover_response_positions_only():
    to_draft = torch.arange(64)
    to_draft[11] = OUTSIDE  # a token the head does not cover
    (x, y), _ = pack_examples([SHARD], to_draft, max_len=512)
    assert x.tolist() == [5, 6, 7, 10, 11, 10] and y.tolist() == [IGNORE, IGNORE, 10, OUTSIDE, 10, 3]
    to_draft = torch.arange(64)
    (x, y), _ = pack_examples([SHARD], to_draft, max_len=4)  # cut to 4 inputs
    assert x.tolist() == [5, 6, 7, 10] and y.tolist() == [IGNORE, IGNORE, 10, 11]
    ids, mask, labels = collate(pack_examples([SHARD], to_draft, 512), pad_id=0)
    assert ids.shape == (2, 6) and mask[1].tolist() == [1, 1, 1, 1, 0, 0] and labels[1, 4:].eq(IGNORE).all()


def test_training_lowers_the_loss_checkpoints_and_resumes(tmp_path):
    target = make_tiny_llama(64, hidden_size=32, num_layers=2, seed=0)
    g = torch.Generator().manual_seed(0)
    answers = [torch.randint(4, 12, (1,), generator=g).tolist() * 10 for _ in range(16)]
    shard = ResponseShard(plan_index=list(range(16)), prompts=[[1, 2]] * 16, responses=answers,
                          chat=[False] * 16, ended=[False] * 16)  # fmt: skip
    target.save_pretrained(tmp_path / "target")
    draft = init_from_target(
        target, build_vocabulary([shard], 8, always=(0,)), (1,), str(tmp_path / "target")
    )
    assert not draft.get_input_embeddings().weight.requires_grad
    examples = pack_examples([shard], draft.lm_head.to_draft, 64)
    before = agreement(draft, examples, pad_id=0)
    config = TrainConfig(lr=1e-2, warmup_steps=1, total_tokens=2000, batch_size=4, checkpoint_seconds=0.0)
    state = train_draft(
        draft, examples, examples, tmp_path, config, pad_id=0, max_seconds=60, log=lambda m: None
    )
    assert state["tokens"] >= 2000 and state["held_out_agreement"] > max(before, 0.8)
    assert (tmp_path / "checkpoint.pt").is_file() and (tmp_path / "progress.json").is_file()
    loaded = load_causal_lm(tmp_path / "draft")  # its embedding read back from the source
    assert agreement(loaded, examples, pad_id=0) == pytest.approx(
        state["held_out_agreement"], abs=0.05
    )  # bf16
    more = TrainConfig(**{**config.__dict__, "total_tokens": 3000})
    logs = []
    again = train_draft(draft, examples, examples, tmp_path, more, pad_id=0, max_seconds=60, log=logs.append)
    assert logs[0].startswith(f"resumed at step {state['step']}") and again["step"] > state["step"]


def test_distill_train_command_end_to_end(tiny_pair_dirs, tiny_tokenizer, tmp_path, capsys):
    target_dir, _ = tiny_pair_dirs
    target = load_causal_lm(target_dir)
    plan = [
        PlanItem(p, False, "code") for p in ["def add(a, b):", "for i in range(3):", "import os", "x = 1"]
    ]
    config = ResponsesConfig(target="t", prompts="train", num_prompts=4, code_every=0, max_new_tokens=16,
                             max_prompt_tokens=64, shard_prompts=1, heldout_chat=0)  # fmt: skip
    run_responses(target, tiny_tokenizer, plan, tmp_path / "resp", config, batch_size=2)
    argv = ["train", "--target", str(target_dir), "--responses", str(tmp_path / "resp"), "--out",
            str(tmp_path / "run"), "--vocab-size", "16", "--layers", "1", "--minutes", "0.05",
            "--held-out-shards", "1", "--total-tokens", "100", "--vocab-background", "0"]  # fmt: skip
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "held_out_agreement=" in out and "coverage_held_out=" in out
    assert load_causal_lm(tmp_path / "run" / "draft").config.draft_vocab_size == 16
    assert (tmp_path / "run" / "draft" / "tokenizer.json").is_file()  # a draft directory like any other
    assert load_causal_lm(tmp_path / "run" / "draft").config.embedding_source == str(target_dir.resolve())
    assert cli.main([*argv, "--layers", "7"]) == 0  # resumes from the checkpoint: --layers is not used
    # a new run from the exported draft continues its token count, and reports agreement on --eval sets
    trained = json.loads((tmp_path / "run" / "draft" / "training.json").read_text())
    assert trained["tokens"] >= 100
    more = [*argv[:6], str(tmp_path / "run2"), "--init", str(tmp_path / "run" / "draft"), "--minutes", "0.02",
            "--held-out-shards", "1", "--total-tokens", str(trained["tokens"] + 50),
            "--eval", str(tmp_path / "resp")]  # fmt: skip
    capsys.readouterr()
    assert cli.main(more) == 0
    out = capsys.readouterr().out
    assert "agreement_resp=" in out and "coverage_resp=" in out
    grown = [*more[:6], str(tmp_path / "grown"), *more[7:], "--grow-layers", "1"]
    assert cli.main(grown) == 0
    assert load_causal_lm(tmp_path / "grown" / "draft").config.num_hidden_layers == 2
    wider = [*more[:6], str(tmp_path / "wider"), *more[7:], "--grow-vocab", "2"]
    assert cli.main(wider) == 0  # the responses' most frequent two tokens its 16 rows lack
    assert load_causal_lm(tmp_path / "wider" / "draft").config.draft_vocab_size == 18
    assert cli.main([*more[:6], str(tmp_path / "x"), "--grow-layers", "1"]) == 2  # nothing to grow
    assert "--init" in capsys.readouterr().err
    assert cli.main([*more[:6], str(tmp_path / "x"), "--grow-vocab", "1"]) == 2
    assert "--init" in capsys.readouterr().err
    assert json.loads((tmp_path / "run2" / "progress.json").read_text())["tokens"] >= trained["tokens"] + 50
    # a schedule --init's draft has finished is refused before anything loads (it trained nothing, silently);
    # --new-schedule starts one anew from its weights
    ended = [*more[:6], str(tmp_path / "run3"), *more[7:]]
    ended[ended.index("--total-tokens") + 1] = str(trained["tokens"])
    capsys.readouterr()
    assert cli.main(ended) == 2 and "--new-schedule" in capsys.readouterr().err
    assert cli.main([*ended, "--new-schedule"]) == 0
    anew = json.loads((tmp_path / "run3" / "progress.json").read_text())
    assert anew["tokens"] > 0  # it trained: a schedule of --total-tokens counted from 0
    assert cli.main(["train", "--target", str(target_dir), "--responses", str(tmp_path / "resp"), "--out",
                     str(tmp_path / "other"), "--layers", "7", "--vocab-size", "16"]) == 2  # fmt: skip
    assert "the target has 2 layers" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["qwen2", "qwen3"])
def test_a_qwen_targets_feature_draft_end_to_end(kind, tiny_tokenizer, tmp_path):
    """`responses` → `features` → `train --features` on a Qwen 2 or Qwen 3 target: the exported feature
    draft loads, and SpeculativeDecoder with it decodes the target's greedy text on both paths."""
    from acchead.head import AcceptanceHead
    from acchead.inference import SpeculativeDecoder

    target = _tiny_qwen(kind, 2, vocab_size=len(tiny_tokenizer), eos=tiny_tokenizer.eos_token_id)
    target.save_pretrained(tmp_path / "target")
    tiny_tokenizer.save_pretrained(tmp_path / "target")
    plan = [PlanItem(p, False, "code") for p in ["def add(a, b):", "for i in range(3):", "x = 1"]]
    config = ResponsesConfig(target="t", prompts="train", num_prompts=3, code_every=0, max_new_tokens=16,
                             max_prompt_tokens=64, shard_prompts=1, heldout_chat=0)  # fmt: skip
    run_responses(target, tiny_tokenizer, plan, tmp_path / "resp", config, batch_size=2)
    common = ["--target", str(tmp_path / "target"), "--responses", str(tmp_path / "resp")]
    assert cli.main(["features", *common, "--out", str(tmp_path / "feat" / "resp")]) == 0
    assert cli.main(["train", *common, "--out", str(tmp_path / "run"), "--features", str(tmp_path / "feat"),
                     "--vocab-size", "16", "--minutes", "0.05", "--held-out-shards", "1",
                     "--total-tokens", "200", "--vocab-background", "0"]) == 0  # fmt: skip
    draft = load_causal_lm(tmp_path / "run" / "draft")
    assert (draft.config.attention_bias, draft.config.qk_norm) == (kind == "qwen2", kind == "qwen3")
    target.generation_config.eos_token_id = draft.generation_config.eos_token_id = None
    ids = torch.tensor(tiny_tokenizer("def add(a, b):").input_ids)
    want = target.generate(ids[None], max_new_tokens=30, do_sample=False, pad_token_id=0)[0, len(ids) :]
    for fast in (False, True):
        dec = SpeculativeDecoder(target, draft, policy="specdecpp:h=0.5,max=4", fast=fast, compile=False,
                                 head=AcceptanceHead(draft.config.hidden_size, depth=1))  # fmt: skip
        assert dec.generate(ids, max_new_tokens=30, temperature=0).new_ids.tolist() == want.tolist()
