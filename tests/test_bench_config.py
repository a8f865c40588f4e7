"""acchead-bench's configuration: the shipped configs/bench.yaml (the issue's grid, default heads resolved at
the command line), the real pair's configs/bench-smollm2.yaml, a user --config layered under the flags, and
the grids' validation."""

from __future__ import annotations

import pytest

from acchead.errors import AccheadError
from acchead.inference.bench.config import build_parser, resolve_args
from acchead.inference.bench.settings import build_settings
from acchead.sampling import SamplingConfig


def test_shipped_config_loads_with_the_issue_grid(tmp_path):
    args = resolve_args(build_parser().parse_args([]))
    assert args.k_grid == [1, 2, 3, 4, 5, 6, 8, 10, 12, 14]
    assert args.h_grid == pytest.approx([0.1 * i for i in range(1, 10)])
    assert args.prompts == "humaneval" and args.temperature == 0.0
    assert {"autoregressive", "specdec", "specdecpp", "confidence", "oracle", "hf-assisted"} <= set(
        args.methods
    )
    # Issue 10: the training-free entropy rules, and pricing at declared cost ratios.
    assert {"entropy", "adaedl", "adaedl-adapt"} <= set(args.methods)
    assert args.adaedl_lam_grid == [0.1, 0.3, 0.5, 0.7] and args.adaedl_adapt_grid == [0.1, 0.5]
    assert args.adaedl_gamma == 0.2 and args.entropy_tau_grid == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert args.cost_ratios == [0.2, 0.1, 0.05] and args.plot_ratio is None
    # Default heads, resolved at the command line: every shipped head trained under greedy decoding, the
    # demo pair's default first.
    from acchead import demo_pair

    shipped = demo_pair.shipped_heads(SamplingConfig(0.0))
    assert args.head[0] == str(demo_pair.default_head(SamplingConfig(0.0)))
    assert sorted(args.head) == sorted(map(str, shipped))
    settings, _ = build_settings(args, SamplingConfig(0.0))
    specs = [s.spec for s in settings]
    assert len(settings) == 37 + 9 * len(args.head)  # 9 thresholds h per head
    assert args.extra_specs == ["copy+specdec:k=3"] and "copy+specdec:k=3" in specs  # copy rounds beside them
    assert args.paths == ["eager"] and "hf-generate" in args.methods  # issue 11: opt-in fast path
    assert "adaedl:gamma=0.2,lam=0.5,adapt=1" in specs and "entropy:tau=4" in specs
    assert sum(s.family == "adaedl" for s in settings) == 4
    assert build_settings(args, SamplingConfig(1.0))[0][-5].family == "adaedl-adapt"  # sampling: no oracle
    custom = settings[-2]  # hf-custom: the first head's SpecDec++ h = 0.8, decoded through generate
    assert (custom.family, custom.spec, custom.head) == ("hf-custom", "specdecpp:h=0.8,max=20", args.head[0])
    user = tmp_path / "user.yaml"
    user.write_text("k_grid: [3, 5]\nextra_specs: ['ucb:arms=specdec:k=2|specdecpp:h=0.5,max=8']\n")
    args = resolve_args(build_parser().parse_args(["--config", str(user), "--k-grid", "7"]))
    assert args.k_grid == [7] and args.extra_specs == ["ucb:arms=specdec:k=2|specdecpp:h=0.5,max=8"]
    assert args.prompts == "humaneval"  # keys the user config leaves out keep the shipped defaults
    for text, message in [("warp: 9\n", "unknown keys warp"), ("top_k: 0.5\n", "bad value for top_k"),
                          ("temperature: hot\n", "bad value for temperature: 'hot'"),
                          ("temperature: true\n", "bad value for temperature: True"),
                          ("overwrite: 1\n", "bad value for overwrite: 1"),
                          ("k_grid: [2, x]\n", "bad value for k_grid"),
                          ("goals: 5\n", "a mapping of goal names"),
                          ("prompts: 5\n", "bad value for prompts"),
                          ("out: 5\n", "bad value for out"), ("threads: -3\n", "bad value for threads"),
                          ("batch_size: abc\n", "bad value for batch_size")]:  # fmt: skip
        user.write_text(text)  # each a traceback, or taken (threads: -3), before the audit of 2026-12-08
        with pytest.raises(AccheadError, match=message):
            resolve_args(build_parser().parse_args(["--config", str(user)]))
    user.write_text("batch_size: 4\n")  # a scalar, as a flag's one-element list
    assert resolve_args(build_parser().parse_args(["--config", str(user)])).batch_size == [4]
    user.write_bytes(b"prompts: \xff\xfe\n")
    with pytest.raises(AccheadError, match="is not valid YAML"):
        resolve_args(build_parser().parse_args(["--config", str(user)]))
    with pytest.raises(AccheadError, match="temperature must be >= 0"):
        resolve_args(build_parser().parse_args(["--temperature", "-1"]))


def test_the_real_pair_config_judges_issue_31_goals():
    """configs/bench-smollm2.yaml (what `make demo` passes): the goals priced at c = 0.15, the issue's."""
    from acchead.configs import config_path

    args = resolve_args(build_parser().parse_args(["--config", str(config_path("bench-smollm2"))]))
    assert args.cost_ratios == [0.15, 0.1] and args.goals.ratio == 0.15
    assert (args.goals.greedy_over_specdec, args.goals.greedy_oracle_gap) == (1.15, 0.40)
    assert args.goals.sampling_over_specdec == 1.07 and args.goals.head_overhead_max == 0.03  # rest: shipped
    assert args.k_grid == [1, 2, 3, 4, 5, 6, 8, 10, 12, 14]  # keys it leaves out keep configs/bench.yaml's


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--entropy-tau-grid", "-1"], "--entropy-tau-grid needs finite thresholds >= 0"),
        (["--adaedl-lam-grid", "0.5,1.5"], "--adaedl-lam-grid needs lambda values in [0, 1]"),
        (["--adaedl-adapt-grid", "-0.1"], "--adaedl-adapt-grid needs lambda values in [0, 1]"),
        (["--methods", "adaedl", "--adaedl-lam-grid", ""], "--adaedl-lam-grid needs lambda values"),
        (["--adaedl-gamma", "0"], "--adaedl-gamma must be > 0"),
        (["--cost-ratios", "0.1,inf"], "--cost-ratios needs finite ratios >= 0"),
        (["--plot-ratio", "-1"], "--plot-ratio must be a finite ratio >= 0"),
    ],
)
def test_entropy_grids_and_cost_ratios_are_validated(argv, message):
    with pytest.raises(AccheadError) as e:
        resolve_args(build_parser().parse_args(argv))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_specdecpp_rules_run_the_h_grid_with_the_papers_and_the_priced_thresholds():
    argv = ["--methods", "specdecpp", "--h-grid", "0.5,0.9", "--specdecpp-rules", "paper,priced"]
    args = resolve_args(build_parser().parse_args(argv))
    settings, _ = build_settings(args, SamplingConfig(0.0))
    specs = [s.spec for s in settings if s.head == args.head[0]]
    assert specs == ["specdecpp:h=0.5,max=20", "specdecpp:h=0.9,max=20", "specdecpp:h=0.5,max=20,priced=1",
                     "specdecpp:h=0.9,max=20,priced=1"]  # fmt: skip
    assert [s.params.get("priced", 0) for s in settings[:4]] == [0, 0, 1, 1]
    assert len({s.key for s in settings}) == len(settings)  # every row its own partial file
    for bad in ("", "paper,cheap"):
        with pytest.raises(AccheadError, match="--specdecpp-rules takes paper and/or priced"):
            resolve_args(build_parser().parse_args(["--specdecpp-rules", bad]))


def test_copy_rounds_run_on_every_requested_path_and_other_extras_once():
    """An extra spec with copy rounds beside the draft model runs on each of `--paths` (its fast rows
    "copy@fast"); a model-free drafter or a bandit runs once, eagerly."""
    argv = ["--methods", "specdec,extra", "--k-grid", "2", "--paths", "eager,fast",
            "--extra-specs", "copy:min=2+specdec:k=2;mag+specdec:k=4"]  # fmt: skip
    settings, _ = build_settings(resolve_args(build_parser().parse_args(argv)), SamplingConfig(0.0))
    runs = sorted((s.family, s.decoding.path) for s in settings)
    assert runs == [("copy", "eager"), ("copy@fast", "fast"), ("mag", "eager"), ("specdec", "eager"),
                    ("specdec@fast", "fast")]  # fmt: skip
