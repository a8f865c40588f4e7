"""`python -m acchead.zoo.demo` on the tiny pair: runs end to end; a missing pair is a one-line error."""

from __future__ import annotations

from acchead.zoo.demo import main


def test_demo_runs_on_a_pair(tiny_pair_dirs, capsys):
    target_dir, draft_dir = tiny_pair_dirs
    pair = ["--target", str(target_dir), "--draft", str(draft_dir)]
    assert main([*pair, "--max-new-tokens", "5", "--prompt-index", "2"]) == 0
    out = capsys.readouterr().out
    assert "target target: 0.10M parameters" in out and "no training_report.json" in out
    assert "HumanEval/2, target greedy, 5 tokens" in out and "def truncate_number(" in out
    assert "the draft's greedy choice matches" in out


def test_demo_without_a_built_pair(tmp_path, tiny_pair_dirs, capsys):
    assert main(["--target", str(tmp_path), "--draft", str(tiny_pair_dirs[1])]) == 2
    err = capsys.readouterr().err
    assert "demo model not built yet" in err and len(err.strip().splitlines()) == 1
    pair = ["--target", str(tiny_pair_dirs[0]), "--draft", str(tiny_pair_dirs[1])]
    assert main([*pair, "--prompt-index", "164"]) == 2
    assert "--prompt-index must be in 0..163" in capsys.readouterr().err
