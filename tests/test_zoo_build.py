"""acchead-build-zoo's pairs and CLI (acchead.zoo.pairs, acchead.zoo.build): v1 stays reproducible, v2 meets
issue 21's shape goals, budgets and devices resolve as documented, and bad input is a one-line error."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
from conftest import OPS_AS_PICKED, make_tiny_llama, make_tiny_tokenizer

from acchead.zoo import build, heldout, lm_training
from acchead.zoo.arch import count_step_ops, llama_config, llama_params
from acchead.zoo.pairs import DEFAULT_PAIR, PAIRS, LMSpec


def test_pair_v1_is_the_pair_shipped_before_issue_21():
    v1 = PAIRS["v1"]
    assert v1.target == LMSpec("pycode-target", 256, 6, 4, 1024, 1e-3, 9_000_000, 38.0, 16)
    assert v1.draft == LMSpec("pycode-draft", 128, 2, 2, 768, 2e-3, 4_000_000, 6.0, 16)
    assert v1.distilled_draft == LMSpec("pycode-draft", 128, 2, 2, 768, 1e-3, 60_000_000, 45.0, 16)
    assert (v1.corpus, v1.tokenizer_corpus, v1.work_dir) == ("stdlib", "stdlib", Path("work/zoo"))
    tok = make_tiny_tokenizer()
    assert sum(p.numel() for p in lm_training.make_model(v1.target, tok, 512).parameters()) == llama_params(
        v1.target.shape(), vocab_size=len(tok))


@OPS_AS_PICKED
def test_pair_v2_meets_the_op_ratio_at_v1s_size():
    v1, v2 = PAIRS["v1"], PAIRS["v2"]
    assert DEFAULT_PAIR == "v2" and build.build_parser().parse_args([]).pair == "v2"
    assert v2.draft.shape() == v2.distilled_draft.shape() == v1.draft.shape()  # the draft stays 2 x 128
    assert (v2.corpus, v2.tokenizer_corpus) == ("stdlib+packages", "stdlib")
    ratio = count_step_ops(llama_config(v2.draft.shape())).dispatched / count_step_ops(
        llama_config(v2.target.shape())).dispatched
    assert ratio <= 0.12
    assert abs(llama_params(v2.target.shape()) / llama_params(v1.target.shape()) - 1) <= 0.05
    # Float16 weights of the pair stay well inside the zoo's ~25 MB.
    assert 2 * (llama_params(v2.target.shape()) + llama_params(v2.draft.shape())) < 20e6


def test_budgets_batch_and_device():
    spec = LMSpec("m", 16, 1, 2, 32, 1e-3, 1_000, 10.0, batch_size=64)
    args = argparse.Namespace(budget_scale=0.5, minutes=None, batch_size=None)
    assert lm_training.budgets(spec, args) == (500, 300.0) and lm_training.batch_size_for(spec, args) == 64
    args = argparse.Namespace(budget_scale=0.5, minutes=120.0, batch_size=8)
    assert lm_training.budgets(spec, args) == (500, 7200.0) and lm_training.batch_size_for(spec, args) == 8
    assert build.resolve_device("cpu") == "cpu" and build.resolve_device("auto") in ("cpu", "cuda")


def test_bits_per_byte_count_the_bytes_each_token_stands_for():
    tok = make_tiny_tokenizer()
    text = "def add(a, b):\n    return a + b  # ünïcode\n"
    ids = [*tok(text)["input_ids"], tok.eos_token_id]
    per_byte = heldout.token_bytes(tok)
    assert per_byte[ids].sum() == len(text.encode("utf-8")) and per_byte[tok.eos_token_id] == 0
    model = make_tiny_llama(len(tok), hidden_size=16, num_layers=1, seed=0)
    corpus = np.asarray(ids * 4, dtype=np.uint16)
    m = heldout.evaluate(model, corpus, 8, 64, per_byte)
    window_bytes = sum(per_byte[corpus[i * 9 + 1 : (i + 1) * 9]].sum() for i in range(m["tokens"] // 8))
    assert m["bits_per_byte"] == pytest.approx(m["loss"] * m["tokens"] / np.log(2) / window_bytes)


def test_help_explains_the_pair_and_device_flags(capsys):
    with pytest.raises(SystemExit) as exit_:
        build.main(["--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0
    for flag in ("--pair", "--device", "--minutes", "--batch-size", "--tokenizer-corpus", "--depths", "v1"):
        assert flag in out


@pytest.mark.parametrize(("argv", "message"), [
    (["--pair", "v3"], "invalid choice: 'v3'"),
    (["--budget-scale", "0"], "expected a positive number, got '0'"),
    (["--batch-size", "x"], "expected an integer, got 'x'"),
])
def test_bad_flags_are_one_line_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        build.main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_a_bad_device_is_a_one_line_error(tmp_path, capsys):
    work = tmp_path / "work"
    assert build.main(["--device", "tpu", "--work-dir", str(work), "--out-dir", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--device must be auto, cpu, cuda or cuda:N, got 'tpu'" in err
    assert not work.exists()


@OPS_AS_PICKED
def test_the_arch_stage_builds_nothing(tmp_path, capsys):
    work = tmp_path / "work"
    assert build.main(["--stage", "arch", "--depths", "21", "--widths", "160", "--work-dir", str(work)]) == 0
    assert "picked by op_ratio: 21x160" in capsys.readouterr().out and not work.exists()


def test_spec_reports_keep_their_fields():
    assert list(asdict(PAIRS["v2"].target)) == ["name", "hidden_size", "num_layers", "num_heads",
                                                "intermediate_size", "peak_lr", "token_budget", "minutes",
                                                "batch_size"]


def test_kd_corpus_takes_evenly_spaced_whole_windows():
    ids = np.arange(10 * 4 + 3, dtype=np.uint16)  # 10 windows of 4, and a ragged tail: windows 0, 4, 9
    corpus, suffix = build.kd_corpus(ids, 4, 3)
    assert suffix == "-w3" and corpus.tolist() == [*range(0, 4), *range(16, 20), *range(36, 40)]
    assert build.kd_corpus(ids, 4, None) == (ids, "") and build.kd_corpus(ids, 4, 10)[1] == ""


def test_pair_report_scores_both_drafts_and_writes_its_json(tmp_path):
    """`--stage report` on tiny models: a "distilled" draft that is the target itself agrees with it on every
    greedy position of both prompt sets and is always accepted at T = 1, a random one is not; losses, step
    costs, operator counts, corpus and machine are recorded, and pair_report.json holds what it returned."""
    import json

    from acchead.zoo.pair_report import pair_report

    tok = make_tiny_tokenizer()
    vocab, eos = len(tok), tok.eos_token_id
    pair = PAIRS[DEFAULT_PAIR]
    out, baseline = tmp_path / "out", tmp_path / "baseline"
    target = make_tiny_llama(vocab, hidden_size=64, num_layers=2, seed=1, eos_token_id=eos)
    # the target saved twice: as itself and as the "distilled" draft; the corpus draft is another model
    for model, path in ((target, out / pair.target.name), (target, out / pair.distilled_draft.name),
                        (make_tiny_llama(vocab, 32, 2, seed=2, eos_token_id=eos), baseline)):  # fmt: skip
        model.save_pretrained(path)
        tok.save_pretrained(path)
    args = argparse.Namespace(out_dir=out, baseline_draft=str(baseline), report_prompts=2, seed=0, seq_len=32,
                              eval_tokens=64)  # fmt: skip
    heldout_ids = np.random.default_rng(0).integers(0, vocab, 400)
    report = pair_report(pair, args, heldout_ids, corpus={"sources": "test"})

    assert json.loads((out / "pair_report.json").read_text()) == report
    assert set(report["prompt_sets"]) == {"stdlib-heldout-functions", "humaneval"}
    for scores in report["prompt_sets"].values():
        assert scores["prompts"] == 2
        # the target drafting for itself
        assert scores["after"] == {"greedy_agreement": 1.0, "acceptance_t1": 1.0}
        # (random tied-embedding models all tend to repeat the last token greedily, so the random draft's
        # greedy agreement can be 1 too; its distribution is not the target's)
        assert 0.0 < scores["before"]["acceptance_t1"] < 1.0
    assert report["after"]["heldout"] == report["target"]["heldout"]  # the same weights, the same windows
    assert report["before"]["heldout"]["loss"] != report["target"]["heldout"]["loss"]
    for who in ("before", "after", "target"):
        assert report[who]["decode_step_ms"] > 0
    assert report["op_counts"]["ratio"] == 1.0  # the "distilled" draft has the target's shape
    assert report["corpus"] == {"sources": "test"} and "CPU threads" in report["machine"]
