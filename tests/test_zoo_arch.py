"""Choosing the demo target's shape (acchead.zoo.arch): operator counts of a one-token step, parameter
counts, the candidate table and the pick rule, and `acchead-build-zoo --stage arch`."""

from __future__ import annotations

import json

import pytest
import transformers
from conftest import OPS_AS_PICKED

from acchead.errors import AccheadError
from acchead.zoo import build
from acchead.zoo.arch import (
    Candidate,
    Shape,
    candidate_table,
    count_step_ops,
    heads_for,
    intermediate_for,
    llama_config,
    llama_params,
    pick_target,
)


def _ops(layers: int, hidden: int = 32, context: int = 8) -> int:
    shape = Shape(layers, hidden, 2, 2 * hidden)
    return count_step_ops(llama_config(shape, vocab_size=64, max_positions=64), context).dispatched


def test_step_ops_grow_linearly_with_depth_and_ignore_width():
    one, two, three = _ops(1), _ops(2), _ops(3)
    assert one < two < three and three - two == two - one > 0
    assert _ops(2, hidden=64) == two
    counts = count_step_ops(llama_config(Shape(2, 32, 2, 64), vocab_size=64, max_positions=64), 8)
    assert 0 < counts.non_view < counts.dispatched


@pytest.mark.skipif(transformers.__version__ != "5.23.0", reason="counts recorded with transformers 5.23.0")
def test_step_ops_of_the_demo_shapes_are_the_issues():
    draft, v1_target = Shape(2, 128, 2, 768), Shape(6, 256, 4, 1024)
    assert count_step_ops(llama_config(draft)).dispatched == 136
    assert count_step_ops(llama_config(v1_target)).dispatched == 356


def test_parameter_formula_matches_the_model():
    from transformers import LlamaForCausalLM

    for shape in (Shape(2, 32, 2, 64), Shape(3, 48, 3, 80)):
        model = LlamaForCausalLM(llama_config(shape, vocab_size=100, max_positions=64))
        assert llama_params(shape, vocab_size=100) == sum(p.numel() for p in model.parameters())
    assert llama_params(Shape(6, 256, 4, 1024)) == 7_343_360  # the shipped v1 target's count


def test_heads_and_intermediate_sizes():
    assert [heads_for(h) for h in (128, 160, 192, 256)] == [2, 2, 3, 4]
    with pytest.raises(AccheadError):
        heads_for(7)
    for layers, width in ((21, 160), (24, 128), (16, 192)):
        i = intermediate_for(layers, width, 7_343_360)
        assert i % 32 == 0 and abs(llama_params(Shape(layers, width, 2, i)) / 7_343_360 - 1) < 0.02


def _row(layers: int, width: int, params: int, ratio: float, mlp: float = 3.0) -> Candidate:
    return Candidate(Shape(layers, width, 2, int(mlp * width)), params, 0, 0, ratio, mlp)


def test_pick_takes_the_fewest_layers_meeting_the_ratio_then_the_nearest_size():
    ref = 1_000_000
    rows = [
        _row(20, 160, ref, 0.121),  # misses the ratio
        _row(24, 128, ref, 0.10),
        _row(21, 128, 960_000, 0.115),
        _row(21, 160, 1_010_000, 0.115),
        _row(21, 256, ref, 0.115, mlp=0.5),  # no sensible MLP at this size
        _row(21, 192, 1_200_000, 0.115),  # too far from the reference
    ]
    assert pick_target(rows, ref).shape == Shape(21, 160, 2, 480)
    assert pick_target(rows, ref, max_ratio=0.105).shape.num_layers == 24
    with pytest.raises(AccheadError, match="no candidate"):
        pick_target(rows, ref, max_ratio=0.05)


def test_candidate_table_ratios_and_timings():
    draft = Shape(1, 32, 2, 64)
    draft_row, rows = candidate_table(draft, 300_000, depths=(2, 3), widths=(32,), context=8,
                                      time_steps=True)
    assert draft_row.op_ratio == 1.0 and [r.shape.num_layers for r in rows] == [2, 3]
    for r in rows:
        assert r.op_ratio == pytest.approx(draft_row.ops / r.ops) and r.op_ratio < 1
        assert r.step_ms > 0 and r.step_ratio == pytest.approx(draft_row.step_ms / r.step_ms)


@OPS_AS_PICKED
def test_arch_cli_prints_the_pick_writes_json_and_rejects_bad_input(tmp_path, capsys):
    out = tmp_path / "arch.json"
    argv = ["--stage", "arch", "--depths", "21", "--widths", "128,160", "--arch-out", str(out)]
    assert build.main(argv) == 0
    text = capsys.readouterr().out
    assert "**21x160 (heads 2, mlp 448)**" in text and "picked by op_ratio" in text
    table = json.loads(out.read_text())
    assert table["picked"]["shape"]["hidden_size"] == 160 and table["picked"]["op_ratio"] <= 0.12
    # 6 layers: op ratio 0.38 > 0.12, nothing to pick
    assert build.main(["--stage", "arch", "--depths", "6", "--widths", "256"]) == 2
    assert "no candidate" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build.main(["--stage", "arch", "--depths", "0,x"])
    assert "expected comma-separated integers, got '0,x'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build.main(["--stage", "arch", "--widths", "0"])
    assert "expected positive integers, got '0'" in capsys.readouterr().err
