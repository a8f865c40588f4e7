"""`--batch-size` on the commands: `acchead-bench` adds a row per (B, batchable setting) to results.json and
the report; `acchead-decode` decodes B rows of its prompt."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from test_bench import _argv, bench_inputs  # noqa: F401  (the fixture, shared with the bench's tests)

from acchead.inference.bench.batched_bench import BatchedRow, batched_table
from acchead.inference.bench.run import main


def test_bench_batch_sizes_add_a_row_per_b(bench_inputs, tmp_path):  # noqa: F811
    out = tmp_path / "bench"
    argv = _argv(bench_inputs, out, "--methods", "autoregressive,specdec,specdecpp", "--temperature", "0",
                 "--batch-size", "1,3")  # fmt: skip
    assert main(argv) == 0
    res = json.loads((out / "results.json").read_text())
    rows = res["batched"]
    specs = [r["spec"] for r in res["rows"]]  # the single-prompt settings, each again per B
    assert [(r["batch_size"], r["spec"]) for r in rows] == [(b, s) for b in (1, 3) for s in specs]
    # Two prompts: B = 1 decodes both one at a time, B = 3 one batch of three rows (prompt 0 again).
    assert {r["rows"] for r in rows if r["batch_size"] == 1} == {2}
    assert {r["rows"] for r in rows if r["batch_size"] == 3} == {3}
    assert all(r["greedy_matches_ar"] for r in rows)  # every row equals batched AR's
    for r in rows:
        assert r["wall_tokens_per_s"] > 0 and r["tokens"] > 0
        if r["spec"] == "autoregressive":
            assert r["draft_calls"] == 0
        else:
            assert r["draft_calls"] > 0
    pp = [r for r in rows if r["spec"].startswith("specdecpp")]
    assert pp and all(
        r["batch_stop"].startswith("batch-stop:gated(B1:c=") and r["head_calls"] > 0 for r in pp
    )  # the bench's default rule: gated
    # each B > 1 decode's gate cap over both passes (the first decode explores; B = 1 runs no gate)
    assert all(r["gate_caps"] is None for r in pp if r["batch_size"] == 1)
    assert all(sum(r["gate_caps"].values()) == 2 and any("*" in k for k in r["gate_caps"])
               for r in pp if r["batch_size"] == 3)  # fmt: skip
    # B = 1 times each setting's single-prompt decoder beside its batched rows, once per setting
    ones = [r["single_wall_tokens_per_s"] for r in rows if r["batch_size"] == 1]
    assert len(ones) == len(specs) and all(one > 0 for one in ones)
    assert all(r["single_wall_tokens_per_s"] is None for r in rows if r["batch_size"] == 3)
    report = (out / "report.md").read_text()
    assert "## Batched decoding" in report and (out / "batched.md").read_text() in report
    assert len([line for line in report.splitlines() if line.startswith("| 3 |")]) == len(specs)


def test_bench_batch_stop_rules_add_a_specdecpp_row_each(bench_inputs, tmp_path):  # noqa: F811
    """`--batch-stop on,measured`: each batched specdecpp setting runs once per rule (the measured one with
    its c(B) table in the row), the other settings once; every greedy row still equals batched AR's."""
    out = tmp_path / "bench"
    argv = _argv(bench_inputs, out, "--methods", "autoregressive,specdecpp", "--temperature", "0",
                 "--batch-size", "2", "--batch-stop", "on,measured")  # fmt: skip
    assert main(argv) == 0
    rows = json.loads((out / "results.json").read_text())["batched"]
    pp = [r for r in rows if r["spec"].startswith("specdecpp")]
    assert len([r for r in rows if r["spec"] == "autoregressive"]) == 1 and len(pp) % 2 == 0
    assert {r["batch_stop"].split("(")[0] for r in pp} == {"batch-stop:c=0.5", "batch-stop:measured"}
    assert all(
        "B1:c=" in r["batch_stop"] and "B2:c=" in r["batch_stop"] for r in pp if "measured" in r["batch_stop"]
    )
    assert all(r["greedy_matches_ar"] for r in rows)
    assert main([*argv[:-1], "nope"]) == 2  # a bad rule: one line, before any model loads


def test_batched_rows_serialise_and_tabulate():
    def row(spec: str, tok_s: float, greedy: bool, matches: bool | None) -> BatchedRow:
        return BatchedRow(batch_size=4, method=spec.split(":")[0], spec=spec, verifier="token",
                          batch_stop=None, rows=4, passes=2, tokens=64, target_calls=16, draft_calls=0,
                          head_calls=0, batch_stops=0, wall_time=1.0, wall_tokens_per_s=tok_s, greedy=greedy,
                          greedy_matches_ar=matches)  # fmt: skip

    ar, k = row("autoregressive", 10.0, True, True), row("specdec:k=3", 25.0, True, True)
    assert list(ar.to_dict())[-5:] == ["greedy_matches_ar", "single_wall_tokens_per_s", "gate_rounds",
                                       "copied_rounds", "gate_caps"]  # fmt: skip
    assert "greedy_matches_ar" not in row("specdec:k=3", 25.0, False, None).to_dict()  # sampling: not judged
    table = batched_table([ar, k]).splitlines()
    assert table[3] == "| 4 | specdec | `specdec:k=3` | - | 25.0 | 2.50 | - | 16 | 0 | 0 | 0 | 64 |"
    one = replace(k, batch_size=1, single_wall_tokens_per_s=20.0)
    assert batched_table([one]).splitlines()[2].split(" | ")[6] == "1.25 (20.0 tokens/s)"
    measured = replace(k, spec="specdecpp:h=0.8", batch_stop="batch-stop:measured(B1:c=0.1,B4:c=0.52)")
    declared = replace(k, spec="specdecpp:h=0.8", batch_stop="batch-stop:c=0.2")
    gated = replace(measured, batch_stop="batch-stop:gated(B1:c=0.1,B4:c=0.52)", gate_rounds=9,
                    gate_caps={"1*": 1, "12": 1, "3": 5, "0": 2})  # fmt: skip
    table = batched_table([measured, declared, gated]).splitlines()[2:]
    assert [line.split(" | ")[3] for line in table[:3]] == ["measured, c=0.52", "c=0.2", "gated, c=0.52"]
    assert table[2].split(" | ")[10] == "9"  # the gated rounds
    # how the gate decided, below the table: decodes per cap, in the caps' order
    assert table[-1] == "- B = 4, specdec: cap 0 ×2, cap 1* ×1, cap 3 ×5, cap 12 ×1"


def test_decode_batch_size_prints_every_row(tiny_pair_dirs, bench_inputs, capsys):  # noqa: F811
    """`acchead-decode --batch-size 3`: three rows of the prompt; greedy rows are the same text, and the same
    as the single-prompt decode's."""
    from acchead.inference.cli_decode import main as decode_main

    t, d = tiny_pair_dirs
    base = ["--target", str(t), "--draft", str(d), "--prompt", "def f(x):", "--max-new-tokens", "10",
            "--policy", "specdec:k=3", "--temperature", "0", "--json"]  # fmt: skip
    assert decode_main(base) == 0
    single = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert decode_main([*base, "--batch-size", "3"]) == 0
    stats = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert stats["batch_size"] == 3 and stats["texts"] == [single["text"]] * 3
    assert stats["tokens"] == 3 * single["tokens"] and stats["target_calls"] == single["target_calls"]
    assert decode_main([*base[:-1], "--batch-size", "2", "--temperature", "1.0"]) == 0
    out = capsys.readouterr().out
    assert "--- row 1 (seed 1)" in out and "B = 2" in out and "draft calls" in out
    pp = [*base[: base.index("--policy")], "--policy", "specdecpp:h=0.5", "--temperature", "0", "--json"]
    head = ["--head", str(bench_inputs["head"])]
    assert decode_main([*pp, *head, "--batch-size", "2", "--batch-stop", "measured"]) == 0
    stats = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (
        stats["batch_stop"].startswith("batch-stop:measured(B1:c=") and stats["texts"][0] == stats["texts"][1]
    )
    assert decode_main([*base, "--batch-size", "0"]) == 2
    assert "--batch-size must be >= 1" in capsys.readouterr().err
    # --prompts: B different prompts in one batch, each row the text its prompt decodes to alone
    prompts = bench_inputs["prompts"]
    texts = [json.loads(line)["prompt"] for line in prompts.read_text().splitlines()[:2]]
    many = [*base[: base.index("--prompt")], *base[base.index("--prompt") + 2 :]]
    assert decode_main([*many, "--prompts", str(prompts), "--batch-size", "3"]) == 0
    stats = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    alone = []
    for text in texts:
        assert decode_main([*many, "--prompt", text]) == 0
        alone.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1])["text"])
    assert len(texts) == 2 and stats["texts"] == [*alone, alone[0]]  # cycled to B = 3 rows
    assert decode_main([*many, "--prompts", str(prompts)]) == 2
    assert "add --batch-size" in capsys.readouterr().err


def test_decode_batch_size_fast_compiles_first(tiny_pair_dirs, capsys, monkeypatch):
    """`acchead-decode --batch-size 2 --fast`: the batched fast path (its static caches uncompiled here:
    tests/test_batched_fast.py compiles them), warmed up before the timing; the rows' text is the eager
    batch's."""
    import acchead.inference.batched as batched
    from acchead.inference.cli_decode import main as decode_main
    from acchead.inference.static_ragged_cache import StaticRaggedCache

    monkeypatch.setattr(batched, "ragged_cache", lambda model, _, path: StaticRaggedCache(model, False, path))
    t, d = tiny_pair_dirs
    base = ["--target", str(t), "--draft", str(d), "--prompt", "def f(x):", "--max-new-tokens", "10",
            "--policy", "specdec:k=3", "--temperature", "0", "--json", "--batch-size", "2"]  # fmt: skip
    assert decode_main(base) == 0
    eager = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert decode_main([*base, "--fast"]) == 0
    fast = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert eager["warm_up_s"] == 0.0 and fast["warm_up_s"] > 0.0
    assert fast["texts"] == eager["texts"] and fast["target_calls"] == eager["target_calls"]


def test_bench_batches_copy_rounds_beside_the_draft(bench_inputs, tmp_path):  # noqa: F811
    """An extra spec with copy rounds beside the draft model is batchable: a batched row per B, its outputs
    equal batched AR's, its copied rounds counted; copy + SpecDec++ runs under --batch-stop's rules, the
    gated one as measured (the round gate is refused with copy rounds), once where both are asked for."""
    out = tmp_path / "bench"
    argv = _argv(bench_inputs, out, "--methods", "autoregressive,extra", "--temperature", "0",
                 "--batch-size", "2", "--batch-stop", "gated,measured",
                 "--extra-specs", "copy:min=1,block=4+specdec:k=2;copy:min=1+specdecpp:h=0.5")  # fmt: skip
    assert main(argv) == 0
    rows = {r["spec"]: r for r in json.loads((out / "results.json").read_text())["batched"]}
    copy = rows["copy:min=1,block=4+specdec:k=2"]
    assert copy["greedy_matches_ar"] and copy["copied_rounds"] > 0 and copy["draft_calls"] > 0
    assert rows["autoregressive"]["copied_rounds"] == 0
    pp = [r for spec, r in rows.items() if spec.startswith("copy:min=1+specdecpp")]
    assert len(pp) == 1 and pp[0]["greedy_matches_ar"]
    assert pp[0]["batch_stop"].startswith("batch-stop:measured(")


def test_batch_rules_of_each_setting():
    """Which `--batch-stop` rules a setting runs under: SpecDec++ every rule; with copy rounds `gated` as
    `measured` (the gate is refused there), each rule once whatever its case; other policies none."""
    from acchead.inference.bench.batched_bench import _rules
    from acchead.inference.bench.settings import Setting
    from acchead.inference.spec import DecodingSpec

    def rules(spec: str, asked: list[str]) -> list[str | None]:
        return _rules(Setting("m", DecodingSpec.from_spec(spec)), asked)

    assert rules("specdecpp:h=0.5", ["gated", "measured"]) == ["gated", "measured"]
    assert rules("copy+specdecpp:h=0.5", ["gated"]) == ["measured"]
    assert rules("copy+specdecpp:h=0.5", ["Gated", "on", "Measured"]) == ["Measured", "on"]
    assert rules("specdec:k=2", ["gated"]) == [None]
    assert rules("specdecpp:h=0.5", []) == [None]


@pytest.mark.usefixtures("uncompiled_runners")
def test_decode_fast_warms_up_before_the_timed_decode(tiny_pair_dirs, capsys):
    """`acchead-decode --fast` (one prompt) compiles its units before the streamed decode, so the tokens/s
    it prints is the decode's own, and says how long the warm-up took (the runners uncompiled here: the
    fast-path tests compile them); the text and counts are the eager decode's."""
    from acchead.inference.cli_decode import main as decode_main

    t, d = tiny_pair_dirs
    base = ["--target", str(t), "--draft", str(d), "--prompt", "def f(x):", "--max-new-tokens", "10",
            "--policy", "specdec:k=3", "--temperature", "0"]  # fmt: skip
    assert decode_main([*base, "--json"]) == 0
    eager = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert decode_main([*base, "--json", "--fast"]) == 0
    fast = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert eager["warm_up_s"] == 0.0 and fast["warm_up_s"] > 0.0
    assert fast["text"] == eager["text"] and fast["target_calls"] == eager["target_calls"]
    assert decode_main([*base, "--fast"]) == 0
    assert "fast path warmed up in" in capsys.readouterr().out
