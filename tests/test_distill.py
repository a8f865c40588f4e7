"""Draft distillation (acchead.zoo.distill, acchead-build-zoo's draft stage) on tiny local models."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
import torch
from conftest import make_tiny_llama

from acchead.zoo import build
from acchead.zoo.distill import (
    TeacherCache,
    build_teacher_cache,
    generate_windows,
    kd_loss,
    load_teacher_cache,
    sample_kd_batch,
    topk_kl,
    window_agreement,
)

V = 64


def _full_kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    lp, lq = p_logits.log_softmax(-1), q_logits.log_softmax(-1)
    return (lp.exp() * (lp - lq)).sum(-1).mean()


def test_topk_kl_is_the_full_kl_at_k_equals_vocab_and_a_lower_bound_below():
    g = torch.Generator().manual_seed(0)
    p, q = torch.randn(2, 5, V, generator=g) * 2, torch.randn(2, 5, V, generator=g) * 2
    lp = p.log_softmax(-1)
    full = _full_kl(p, q)
    top = lp.topk(V, -1)
    assert torch.allclose(topk_kl(q, top.indices, top.values), full, atol=1e-5)
    for k in (1, 4, 16):
        top = lp.topk(k, -1)
        assert topk_kl(q, top.indices, top.values) <= full + 1e-6
    top = lp.topk(8, -1)
    assert topk_kl(p, top.indices, top.values).abs() < 1e-6  # the student equals the teacher
    mask = torch.zeros(2, 5, dtype=torch.bool)
    mask[0, :2] = True
    ids, lps = top.indices, top.values
    per_pos = [topk_kl(q[:1, i : i + 1], ids[:1, i : i + 1], lps[:1, i : i + 1]) for i in (0, 1)]
    assert torch.allclose(topk_kl(q, top.indices, top.values, mask), torch.stack(per_pos).mean(), atol=1e-6)


@pytest.fixture(scope="module")
def teacher():
    return make_tiny_llama(V, hidden_size=32, num_layers=2, seed=1)


def test_teacher_cache_holds_the_targets_top_k_and_resumes(teacher, tmp_path):
    corpus = np.random.default_rng(0).integers(1, V, 16 * 10 + 3).astype(np.uint16)
    cache = build_teacher_cache(teacher, corpus, 16, 4, tmp_path / "c", batch_size=3, ckpt_seconds=0.0)
    assert cache.ids.shape == (10, 16, 4)
    with torch.no_grad():
        x = torch.from_numpy(corpus[16:32].astype(np.int64))[None]
        top = teacher(x).logits[0].log_softmax(-1).topk(4, -1)
    assert np.array_equal(cache.ids[1], top.indices.numpy())
    assert np.allclose(cache.logp[1], top.values.numpy(), atol=1e-2)
    # A killed run resumes from progress.json: pretend only 4 windows were done, wreck the rest.
    (tmp_path / "c" / "done.json").unlink()
    meta = {"num_windows": 10, "seq_len": 16, "k": 4, "corpus_tokens": len(corpus)}
    (tmp_path / "c" / "progress.json").write_text(json.dumps({"meta": meta, "windows_done": 4}))
    ids = np.load(tmp_path / "c" / "ids.npy", mmap_mode="r+")
    ids[4:] = 0
    ids.flush()
    del ids
    again = build_teacher_cache(teacher, corpus, 16, 4, tmp_path / "c", batch_size=3)
    assert np.array_equal(np.asarray(again.ids), np.asarray(cache.ids))
    assert isinstance(load_teacher_cache(tmp_path / "c"), TeacherCache)


def test_distillation_moves_the_student_toward_the_teacher(teacher, tmp_path):
    """train_lm with the KD objective: the student's top-k KL to the teacher falls, the report has a curve."""
    corpus = np.random.default_rng(1).integers(1, V, 16 * 40).astype(np.uint16)
    cache = build_teacher_cache(teacher, corpus, 16, 8, tmp_path / "c")
    student_dir = tmp_path / "student"
    make_tiny_llama(V, hidden_size=16, num_layers=1, seed=2).save_pretrained(student_dir)
    tok_dir = tmp_path / "tok"
    from conftest import make_tiny_tokenizer

    make_tiny_tokenizer(V).save_pretrained(tok_dir)
    args = argparse.Namespace(seed=0, work_dir=tmp_path / "w", out_dir=tmp_path / "out", budget_scale=1.0,
                              batch_size=8, seq_len=16, bf16=False, ckpt_minutes=0.0, eval_tokens=160)
    args.work_dir.mkdir()
    spec = build.LMSpec("tiny-draft", 16, 1, 2, 32, 5e-3, 8 * 16 * 60, 5.0)
    gen = torch.Generator().manual_seed(0)
    batch = sample_kd_batch(cache, corpus, 16, gen)
    from transformers import LlamaForCausalLM

    before = kd_loss(LlamaForCausalLM.from_pretrained(student_dir), batch).item()
    report = build.train_lm(
        spec, tok_dir, corpus[:160], args, lambda g: sample_kd_batch(cache, corpus, 8, g), kd_loss,
        student_dir, probe=lambda m: {"kl": kd_loss(m, batch).item()}, run_name="tiny-distill",
    )
    after = kd_loss(LlamaForCausalLM.from_pretrained(args.out_dir / "tiny-draft", dtype=torch.float32), batch)
    assert after.item() < 0.8 * before
    assert report["init"] == "student" and report["curve"] and report["curve"][-1]["tokens"] == 8 * 16 * 60
    assert report["stopped_by"] == "tokens" and report["batch_size"] == 8


def test_generated_windows_follow_the_target_and_score_it_against_itself(teacher):
    prompts = [[1, 2, 3], list(range(5, 30))]
    w = generate_windows(teacher, prompts, context=8, new_tokens=6, pad_id=0, k=3, batch_size=2)
    assert w.tokens.shape == (2, 14) and list(w.start) == [5, 0]
    assert list(w.tokens[0, 5:8]) == [1, 2, 3] and list(w.tokens[1, :8]) == list(range(22, 30))
    # greedy: each generated token is the top-1 of the previous position's teacher distribution
    assert np.array_equal(w.ids[:, 7:13, 0], w.tokens[:, 8:14])
    with torch.no_grad():
        ref = teacher.generate(torch.tensor([[0] * 5 + [1, 2, 3]]), max_new_tokens=6, do_sample=False,
                               attention_mask=torch.ones(1, 8, dtype=torch.long), pad_token_id=0)
    assert list(w.tokens[0, 8:]) == ref[0, 8:].tolist()
    s = generate_windows(teacher, prompts, context=8, new_tokens=6, pad_id=0, k=1, temperature=1.0)
    m = window_agreement(teacher, teacher, w, s)
    assert m["greedy_agreement"] == 1.0 and abs(m["acceptance_t1"] - 1.0) < 1e-5


def test_build_zoo_help_names_the_recipes(capsys):
    with pytest.raises(SystemExit):
        build.main(["--help"])
    out = capsys.readouterr().out
    assert "--draft-recipe" in out and "--distill-init" in out and "report" in out
