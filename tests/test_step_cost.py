"""The draft's cost per token: multiply-adds counted by hand for a tiny config, a reduced head scoring only
its V_d rows, step timing at a fixed context, and the `cost` command's printed ratios."""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_llama
from transformers import LlamaConfig

from acchead.distill import cli
from acchead.distill.draft import init_from_target
from acchead.step_cost import decode_step_ms, measure_cost, step_multiply_adds, step_seconds


def test_multiply_adds_of_a_llama_step():
    cfg = LlamaConfig(hidden_size=8, intermediate_size=16, num_hidden_layers=3, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=4, vocab_size=100)  # fmt: skip
    # per layer: q 8x8, k and v 8x4 each, o 8x8, MLP 3 x 8x16; head 100 x 8
    assert step_multiply_adds(cfg) == 3 * (64 + 2 * 32 + 64 + 3 * 128) + 800


def test_a_reduced_head_counts_its_rows_only(tmp_path):
    target = make_tiny_llama(64, hidden_size=32, num_layers=2, seed=0)
    draft = init_from_target(target, torch.arange(16), (1,), str(tmp_path))
    full = step_multiply_adds(target.config)
    layer = (full - 64 * 32) // 2
    assert step_multiply_adds(draft.config) == layer + 16 * 32


def test_a_feature_draft_counts_its_fc_and_times_its_own_step(tmp_path):
    target = make_tiny_llama(64, hidden_size=32, num_layers=2, seed=0)
    draft = init_from_target(target, torch.arange(16), (1,), str(tmp_path), feature=True)
    layer = (step_multiply_adds(target.config) - 64 * 32) // 2
    assert step_multiply_adds(draft.config) == layer + 16 * 32 + 2 * 32 * 32  # + fc [embedding; state]
    times = step_seconds(draft, context=12, calls=3)  # its step reads states: no plain forward
    assert len(times) == 3 and all(t > 0 for t in times)


def test_step_timing_keeps_the_context_fixed():
    model = make_tiny_llama(64, hidden_size=32, num_layers=2, seed=0)
    times = step_seconds(model, context=12, calls=4)
    assert len(times) == 4 and all(t > 0 for t in times)
    assert decode_step_ms(model, context=12, calls=3) > 0


def test_cost_report_and_command(tiny_pair_dirs, capsys):
    target_dir, draft_dir = tiny_pair_dirs
    from acchead.models import load_causal_lm

    report = measure_cost(load_causal_lm(target_dir), load_causal_lm(draft_dir), context=8, calls=3, rounds=2)
    macs = [step_multiply_adds(load_causal_lm(d).config) for d in (draft_dir, target_dir)]
    assert report.mac_ratio == pytest.approx(macs[0] / macs[1])
    assert 0 < report.mac_ratio < 0.5 and report.time_ratio > 0 and report.rounds == 2
    argv = ["cost", "--target", str(target_dir), "--draft", str(draft_dir), "--context", "8", "--calls", "3",
            "--rounds", "2", "--goal", "0.9"]  # fmt: skip
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "multiply-adds per token" in out and "(<= 0.9)" in out and "interleaved rounds" in out
    assert cli.main([*argv[:-2], "--calls", "0"]) == 2
    assert "--calls must be >= 1" in capsys.readouterr().err
