"""`python -m acchead.distill.bench_collate`: a feature batch's two ways to float32 states, timed side by
side, with their ratio; bad sizes are one line."""

from __future__ import annotations

import pytest

from acchead.distill import bench_collate


def test_prints_both_ways_and_their_ratio(capsys):
    assert bench_collate.main(["--batch", "2", "--pairs", "5", "--width", "8", "--hidden", "4",
                               "--repeats", "1"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "a batch of 2 x 5 pairs, 8 wide, to float32 on cpu:" in out
    assert "float32 collated on the host:" in out and "float16 collated, converted there:" in out
    assert "ratio host / kept: " in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--batch", "0"], "must be >= 1"), (["--width", "10", "--hidden", "4"], "multiple of --hidden")],
)
def test_bad_sizes_are_one_line(argv, message, capsys):
    assert bench_collate.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
