"""The feature (EAGLE) draft through the pipeline's commands: gen-data labels it (chain labels too), a head
trains on them and decodes with it, and the bench runs it beside AR, eagerly and in batches."""

from __future__ import annotations

import json

import torch

from acchead.distill.draft import init_from_target
from acchead.head import AcceptanceHead
from acchead.inference.decoder import SpeculativeDecoder
from acchead.models import load_causal_lm


def _saved_feature_draft(target_dir, tokenizer, out):
    """Export an untrained feature draft of the target in `target_dir` (every other token) to `out`; the
    target."""
    from acchead.distill.draft import export

    target = load_causal_lm(target_dir)
    vocab = torch.arange(len(tokenizer))[::2].contiguous()
    export(init_from_target(target, vocab, (1,), str(target_dir), feature=True), out, tokenizer=tokenizer)
    return target


def test_gen_data_train_and_decode_take_a_feature_draft(tiny_pair_dirs, tiny_tokenizer, tmp_path):
    from acchead.data_gen import cli as gen_cli
    from acchead.train import cli as train_cli

    target_dir, _ = tiny_pair_dirs
    target = _saved_feature_draft(target_dir, tiny_tokenizer, tmp_path / "draft")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"def f{i}(x):"}) + "\n" for i in range(6)))
    data = tmp_path / "data"
    assert gen_cli.main(["--target", str(target_dir), "--draft", str(tmp_path / "draft"), "--prompts",
                         str(prompts), "--max-new-tokens", "8", "--feature-chain", "2",
                         "--out", str(data)]) == 0  # fmt: skip
    assert json.loads((data / "gen_config.json").read_text())["feature_chain"] == 2
    # a head that also reads each candidate's depth in its round (the chain labels teach it)
    card = ["--data", str(data), "--w-rej", "6", "--depth", "3", "--inputs", "state+logq+depth",
            "--out", str(tmp_path / "head")]  # fmt: skip
    assert train_cli.main(card) == 0
    draft = load_causal_lm(tmp_path / "draft")
    head = tmp_path / "head"
    dec = SpeculativeDecoder(target, draft, policy="specdecpp:h=0.5,max=4", head=head, fast=False)
    assert dec.policy.head.inputs == ("state", "logq", "depth")
    prompt = torch.tensor([[5, 6, 7]])
    ref = target.generate(prompt, max_new_tokens=10, do_sample=False, pad_token_id=0)[0, 3:]
    res = dec.generate(prompt, max_new_tokens=10, temperature=0)
    assert res.new_ids.tolist() == ref.tolist() and res.head_calls > 0
    first = tmp_path / "data-first"  # first-candidate labels only: nothing to learn a depth from
    assert gen_cli.main(["--target", str(target_dir), "--draft", str(tmp_path / "draft"), "--prompts",
                         str(prompts), "--max-new-tokens", "4", "--out", str(first)]) == 0  # fmt: skip
    assert train_cli.main([*card[:1], str(first), *card[2:-1], str(tmp_path / "head-first")]) == 2
    oracle = SpeculativeDecoder(target, draft, policy="oracle", fast=False)  # hindsight through the target
    assert oracle.generate(prompt, max_new_tokens=10, temperature=0).new_ids.tolist() == ref.tolist()


def test_bench_takes_a_feature_draft_and_skips_what_cannot(tiny_pair_dirs, tiny_tokenizer, tmp_path):
    """The bench decodes a feature draft (fixed K, the oracle), every greedy row equal to AR; HF's assisted
    generation, which runs the draft as a plain causal LM, is skipped with a note. (Its fast path compiles
    for two minutes on the CPU: tests/test_feature_fast_path.py, and the slow bench test there.)"""
    from acchead.inference.bench.run import main as bench_main

    target_dir, _ = tiny_pair_dirs
    _saved_feature_draft(target_dir, tiny_tokenizer, tmp_path / "draft")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "def add(a, b):\n    return"}) + "\n")
    out = tmp_path / "bench"
    from acchead.head_io import HeadMetadata, save_head
    from acchead.models import model_identity

    inputs = ("state", "token")
    meta = HeadMetadata(depth=1, hidden_size=64, w_acc=1.0, w_rej=6.0, kind="lookahead", inputs=list(inputs),
                        draft=model_identity(load_causal_lm(tmp_path / "draft")),
                        sampling={"temperature": 0.0, "top_k": 0, "top_p": 1.0})  # fmt: skip
    head = tmp_path / "h.safetensors"
    save_head(AcceptanceHead(64, 1, kind="lookahead", inputs=inputs), head, meta=meta)
    argv = ["--prompts", str(prompts), "--target", str(target_dir), "--draft", str(tmp_path / "draft"),
            "--out", str(out), "--max-new-tokens", "8", "--num-prompts", "0", "--k-grid", "1,3",
            "--methods", "autoregressive,specdec,specdecpp,oracle,hf-assisted,extra", "--h-grid", "0.5",
            "--extra-specs", "copy:min=2+specdec:k=2",
            "--head", str(head), "--paths", "eager", "--overhead-calls", "5"]  # fmt: skip
    assert bench_main(argv) == 0
    res = json.loads((out / "results.json").read_text())
    methods = sorted({r["method"] for r in res["rows"]})
    assert methods == ["autoregressive", "copy", "oracle", "specdec", "specdecpp-lookahead"]
    assert res["head_overhead"]  # timed on the feature draft's own step
    assert all(r["matches_autoregressive"] for r in res["rows"] if r["method"] != "autoregressive")
    assert any("skipped with a feature draft" in n and "hf-assisted" in n for n in res["notes"])
    # batched rows too (the batched feed hands each row the target's states)
    assert bench_main([*argv[:-4], "--batch-size", "1,2", "--overwrite", "--overhead-calls", "5"]) == 0
    batched = json.loads((out / "results.json").read_text())["batched"]
    assert {r["batch_size"] for r in batched} == {1, 2} and all(r["greedy_matches_ar"] for r in batched)
