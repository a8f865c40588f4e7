"""`python -m acchead.distill.bench_autocast`: the features stage's forward in float32 and under bfloat16
autocast, timed side by side, with their ratio and the dtype `--dtype auto` picks; bad input is one line."""

from __future__ import annotations

import pytest

from acchead.distill import bench_autocast


def test_prints_both_ways_and_their_ratio(tiny_pair_dirs, capsys):
    target_dir, _ = tiny_pair_dirs
    assert bench_autocast.main(["--target", str(target_dir), "--batch", "2", "--length", "8",
                                "--fused-layers", "0", "--repeats", "1", "--threads", "1"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "2 x 8 positions, fused layers [0], cpu, 1 threads:" in out
    assert "float32:" in out and "bfloat16 autocast:" in out
    assert "ratio bfloat16 / float32: " in out and "(--dtype auto picks " in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--batch", "0"], "must be >= 1"), (["--device", "cuda:7"], "cuda:7"), (["--fused-layers", "x"], "x")],
)
def test_bad_input_is_one_line(argv, message, tiny_pair_dirs, capsys):
    assert bench_autocast.main(["--target", str(tiny_pair_dirs[0]), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
