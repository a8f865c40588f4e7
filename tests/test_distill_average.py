"""`acchead-distill average`: the weighted average of drafts' weights (a model soup), exported like a trained
draft, its refusals in one line, and its agreement on --eval sets for a feature and an independent draft."""

from __future__ import annotations

import json

import pytest
import torch

from acchead.distill import cli
from acchead.distill.draft import export, fuse_layers, init_from_target
from acchead.distill.responses import PlanItem, ResponsesConfig, run_responses
from acchead.models import load_causal_lm


def _drafts(
    target_dir, tokenizer, root, feature: bool, vocab: torch.Tensor | None = None, fused: tuple[int, ...] = ()
):  # fmt: skip
    """Two drafts of the tiny target: its start, and the start with every weight shifted (as if trained);
    a feature draft reading the outputs of the target's layers `fused` too when given."""
    target = load_causal_lm(target_dir)
    vocab = torch.arange(40) if vocab is None else vocab
    source = str(target_dir.resolve())
    dirs = []
    for i, shift in enumerate((0.0, 0.25)):
        draft = init_from_target(target, vocab, (1,), embedding_source=source, feature=feature)
        if fused:
            draft = fuse_layers(draft, fused)
        with torch.no_grad():
            for name, p in draft.named_parameters():
                if name != "model.embed_tokens.weight":
                    p.add_(shift)
        training = {"step": 10 * (i + 1), "tokens": 100 * (i + 1), "held_out_agreement": 0.5}
        export(draft, root / f"d{i}", training, tokenizer)
        dirs.append(root / f"d{i}")
    return dirs


def _responses(target_dir, tokenizer, out):
    plan = [PlanItem(p, False, "code") for p in ["def add(a, b):", "x = 1"]]
    config = ResponsesConfig(target="t", prompts="train", num_prompts=2, code_every=0, max_new_tokens=12,
                             max_prompt_tokens=64, shard_prompts=1, heldout_chat=0)  # fmt: skip
    run_responses(load_causal_lm(target_dir), tokenizer, plan, out, config, batch_size=2)


@pytest.mark.parametrize("feature", [True, False], ids=["feature", "independent"])
def test_the_average_is_each_weight_averaged_and_is_evaluated(
    tiny_pair_dirs, tiny_tokenizer, tmp_path, capsys, feature
):  # fmt: skip
    target_dir, _ = tiny_pair_dirs
    a, b = _drafts(target_dir, tiny_tokenizer, tmp_path, feature)
    _responses(target_dir, tiny_tokenizer, tmp_path / "resp")
    out = tmp_path / "soup"
    argv = ["average", "--target", str(target_dir), "--drafts", str(a), str(b), "--weights", "1", "3",
            "--out", str(out), "--eval", str(tmp_path / "resp")]  # fmt: skip
    if feature:
        argv.append("--target-states")
    assert cli.main(argv) == 0
    said = capsys.readouterr().out
    assert "weights=[0.25, 0.75]" in said and "agreement_resp=" in said and "coverage_resp=" in said
    assert ("agreement_by_depth_resp=" in said) == feature
    wa, wb, ws = (load_causal_lm(d).state_dict() for d in (a, b, out))
    for k, v in ws.items():
        if v.is_floating_point() and k != "model.embed_tokens.weight":
            ref = (0.25 * wa[k].float() + 0.75 * wb[k].float()).to(torch.bfloat16).float()
            assert torch.equal(v.float(), ref), k  # averaged in float32, exported in bf16
        else:
            assert torch.equal(v, wb[k]), k  # the vocabulary maps and the target's embedding
    training = json.loads((out / "training.json").read_text())
    assert training["tokens"] == 200 and training["step"] == 20  # the last draft's schedule goes on
    assert "held_out_agreement" not in training  # that was another model's
    assert [p["weight"] for p in training["averaged_from"]] == [0.25, 0.75]
    assert training["averaged_from"][0]["training"]["tokens"] == 100
    # a later `train --init` takes the averaged draft like any exported one
    assert load_causal_lm(out).config.draft_vocab_size == 40


def test_a_fused_drafts_eval_reads_its_fused_layers(tiny_pair_dirs, tiny_tokenizer, tmp_path, monkeypatch):
    """A state only H wide reads as zeros in a fused draft's columns, without an error: `average --eval`
    asks the target for the draft's fused layers too (until the twenty-fourth session it did not, and
    measured run 15's draft at 0.537 / 0.638 on MT-bench / HumanEval instead of its 0.575 / 0.678)."""
    from acchead.distill import train_stage

    target_dir, _ = tiny_pair_dirs
    a, b = _drafts(target_dir, tiny_tokenizer, tmp_path, feature=True, fused=(0,))
    _responses(target_dir, tiny_tokenizer, tmp_path / "resp")
    asked, reader = [], train_stage._states_reader

    def spy(features, target, layers=()):
        asked.append(tuple(layers))
        return reader(features, target, layers)

    monkeypatch.setattr(train_stage, "_states_reader", spy)
    argv = ["average", "--target", str(target_dir), "--drafts", str(a), str(b), "--out",
            str(tmp_path / "soup"), "--eval", str(tmp_path / "resp"), "--target-states"]  # fmt: skip
    assert cli.main(argv) == 0
    assert asked == [(0,)]


def test_refusals_are_one_line(tiny_pair_dirs, tiny_tokenizer, tmp_path, capsys):
    target_dir, _ = tiny_pair_dirs
    a, b = _drafts(target_dir, tiny_tokenizer, tmp_path, feature=True)
    (tmp_path / "other").mkdir()
    (c,) = _drafts(target_dir, tiny_tokenizer, tmp_path / "other", True, torch.arange(40).flip(0))[:1]
    (tmp_path / "indep").mkdir()
    (d,) = _drafts(target_dir, tiny_tokenizer, tmp_path / "indep", False)[:1]
    base = ["average", "--target", str(target_dir), "--out", str(tmp_path / "soup"), "--drafts"]
    cases = {
        (str(a),): "two drafts or more",
        (str(a), str(b), "--weights", "1"): "one weight >= 0 per draft",
        (str(a), str(b), "--weights", "0", "0"): "not all 0",
        (str(a), str(tmp_path / "missing")): "no draft directory",
        (str(a), str(c)): "another vocabulary",
        (str(a), str(d)): "architecture",
        (str(a), str(b), "--eval", str(tmp_path)): "add --features or --target-states",
    }
    for args, message in cases.items():
        assert cli.main([*base, *args]) == 2, args
        err = capsys.readouterr().err
        last = err.strip().splitlines()[-1]  # after transformers' loading bars, when it loaded a draft
        assert last.startswith("acchead-distill: error: ") and message in last, (args, err)
        assert "Traceback" not in err and err.count("error:") == 1
    assert cli.main([*base, str(a), str(b)]) == 0
    assert cli.main([*base, str(a), str(b)]) == 2 and "--overwrite" in capsys.readouterr().err
    assert cli.main([*base, str(a), str(b), "--overwrite"]) == 0
