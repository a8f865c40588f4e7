"""The target's own responses for distillation: the plan, batched greedy = unbatched greedy, shards that
round-trip, a killed run resumes after its last complete shard, and other settings are refused."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from acchead.distill import cli, stages
from acchead.distill.responses import (
    PlanItem,
    ResponsesConfig,
    build_plan,
    encode,
    greedy_batch,
    load_responses,
    run_responses,
)
from acchead.errors import AccheadError

PROMPTS = [
    "def add(a, b):",
    "for i in range(10):",
    "import os",
    "class Point:",
    "x = 1",
    "with open(p) as f:",
]


def test_plan_interleaves_code_and_chat_in_order():
    chat, code = [f"c{i}" for i in range(5)], [f"k{i}" for i in range(2)]
    plan = build_plan(chat, code, 8, code_every=3)
    assert [p.text for p in plan] == ["c0", "c1", "k0", "c2", "c3", "k1", "c4"]  # chat runs out at 7
    assert [p.chat for p in plan] == [True, True, False, True, True, False, True]
    assert [p.text for p in build_plan(chat, code, 3, code_every=0)] == ["c0", "c1", "c2"]


def test_batched_greedy_equals_one_prompt_at_a_time(tiny_llama_pair, tiny_tokenizer):
    target, _ = tiny_llama_pair
    eos = tiny_tokenizer.eos_token_id
    prompts = [encode(tiny_tokenizer, PlanItem(p, False, "code")) for p in PROMPTS[:4]]
    assert len({len(p) for p in prompts}) > 1  # ragged: the batch is left-padded
    batched = greedy_batch(target, prompts, 12, [eos], eos)
    for p, (resp, ended) in zip(prompts, batched, strict=True):
        ref = target.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False, eos_token_id=eos,
                              pad_token_id=eos)[0, len(p):].tolist()  # fmt: skip
        assert resp == ref[: len(resp)] and ended == (eos in ref)
        assert resp == (ref[: ref.index(eos) + 1] if ended else ref)


def _config(**kw) -> ResponsesConfig:
    base = dict(target="t", prompts="train", num_prompts=6, code_every=0, max_new_tokens=8,
                max_prompt_tokens=64, shard_prompts=2, heldout_chat=0)  # fmt: skip
    return ResponsesConfig(**{**base, **kw})


def test_shards_round_trip_and_a_killed_run_resumes(tiny_llama_pair, tiny_tokenizer, tmp_path):
    target, _ = tiny_llama_pair
    plan = [PlanItem(p, False, "code") for p in PROMPTS]
    summary = run_responses(target, tiny_tokenizer, plan, tmp_path, _config(), batch_size=4)
    assert summary["shards_written"] == 3 and summary["tokens"] > 0
    shards = load_responses(tmp_path)
    assert [sorted(s.plan_index) for s in shards] == [[0, 1], [2, 3], [4, 5]]  # by length within a shard
    for s in shards:
        for i, ids in zip(s.plan_index, s.prompts, strict=True):
            assert ids == encode(tiny_tokenizer, plan[i])
    # a run killed after shard 0: shards 1 and 2 are written again, identical
    before = [(s.plan_index, s.responses) for s in shards]
    for k in (1, 2):
        (tmp_path / f"shard-{k:05d}.npz").unlink()
    again = run_responses(target, tiny_tokenizer, plan, tmp_path, _config(), batch_size=3)
    assert again["shards_written"] == 2
    assert [(s.plan_index, s.responses) for s in load_responses(tmp_path)] == before
    with pytest.raises(AccheadError, match=r"other settings .*max_new_tokens"):
        run_responses(target, tiny_tokenizer, plan, tmp_path, _config(max_new_tokens=9), batch_size=4)


def test_long_prompts_are_skipped_and_counted(tiny_llama_pair, tiny_tokenizer, tmp_path):
    target, _ = tiny_llama_pair
    plan = [PlanItem(p, False, "code") for p in [PROMPTS[0], "y = 2 " * 40]]
    summary = run_responses(target, tiny_tokenizer, plan, tmp_path, _config(max_prompt_tokens=20), 2)
    assert summary["skipped_long"] == 1 and load_responses(tmp_path)[0].plan_index == [0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--num-prompts", "0"], "--num-prompts must be >= 1"),
        (["--batch-size", "0"], "--batch-size must be >= 1"),
        (["--code-every", "-1"], "--code-every must be >= 0"),
        (["--minutes", "0"], "--minutes must be > 0"),
        (["--device", "gpu0"], "invalid device 'gpu0'"),
    ],
)
def test_bad_arguments_are_one_line(tmp_path, capsys, argv, message):
    assert cli.main(["responses", "--out", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_an_out_that_is_a_file_is_one_line(tiny_pair_dirs, tmp_path, capsys):
    """An OS error of a path the user gave is one line, as in every acchead command (a traceback before)."""
    (tmp_path / "a.jsonl").write_text("")
    argv = ["responses", "--out", str(tmp_path / "a.jsonl"), "--target", str(tiny_pair_dirs[0]),
            "--num-prompts", "1"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("acchead-distill: error: ") and err.count("\n") == 1, err


def test_missing_assets_name_the_install_command(tmp_path, capsys):
    assert cli.main(["responses", "--out", str(tmp_path)]) == 2
    assert "run `acchead-assets`" in capsys.readouterr().err


def test_plan_goes_on_with_later_turns_and_a_longer_plan_extends_a_shorter_one():
    chat, code, more = ["c0", "c1"], ["k0", "k1"], ["t0", "t1", "t2"]
    short = build_plan(chat, code, 4, code_every=2, more_chat=more)
    long = build_plan(chat, code, 9, code_every=2, more_chat=more)
    assert [p.text for p in long] == ["c0", "k0", "c1", "k1", "t0", "t1", "t2"]  # code runs out, then chat
    assert [p.source for p in long[4:]] == ["sharegpt-turn"] * 3 and all(p.chat for p in long[4:])
    assert long[: len(short)] == short


def test_a_batch_or_a_group_spanning_shards_writes_the_same_shards(tiny_llama_pair, tiny_tokenizer, tmp_path):
    """A GPU's batch (larger than a shard), or a group of shards sorted together, answers several shards at
    once; the shards are those that one small batch at a time writes."""
    target, _ = tiny_llama_pair
    plan = [PlanItem(p, False, "code") for p in PROMPTS]
    run_responses(target, tiny_tokenizer, plan, tmp_path / "one", _config(), batch_size=1)
    wide = run_responses(target, tiny_tokenizer, plan, tmp_path / "wide", _config(), batch_size=6)
    grouped = run_responses(target, tiny_tokenizer, plan, tmp_path / "grouped", _config(), batch_size=2,
                            group_shards=3)  # fmt: skip
    assert wide["shards_written"] == grouped["shards_written"] == 3
    def rows(name: str) -> list[tuple]:
        return [(s.plan_index, s.prompts, s.responses, s.ended) for s in load_responses(tmp_path / name)]

    assert rows("wide") == rows("one") and rows("grouped") == rows("one")


def test_device_errors_are_one_line():
    model = torch.nn.Linear(2, 2)
    with pytest.raises(AccheadError, match="invalid device 'gpu0'"):
        stages.to_device(model, "gpu0")
    assert stages.to_device(model, "cpu") is model
    if not torch.cuda.is_available():
        with pytest.raises(AccheadError, match="sees no CUDA device"):
            stages.to_device(model, "cuda")


def test_a_time_limit_stops_between_shards_and_a_rerun_goes_on(tiny_llama_pair, tiny_tokenizer, tmp_path):
    target, _ = tiny_llama_pair
    plan = [PlanItem(p, False, "code") for p in PROMPTS]
    first = run_responses(target, tiny_tokenizer, plan, tmp_path, _config(), batch_size=2, max_seconds=0)
    assert first["shards_written"] == 0 and not load_responses(tmp_path)
    assert json.loads((tmp_path / "responses.json").read_text())["complete"] is False
    rest = run_responses(target, tiny_tokenizer, plan, tmp_path, _config(), batch_size=2)
    assert rest["shards_written"] == 3 and len(load_responses(tmp_path)) == 3
    assert json.loads((tmp_path / "responses.json").read_text())["complete"] is True


def test_each_shard_records_the_dtype_it_was_answered_in(tiny_llama_pair, tiny_tokenizer, tmp_path):
    """A bfloat16 run and a float32 run extend one directory; each shard says which answered it, and a
    shard written before the record existed reads as float32."""
    target, _ = tiny_llama_pair
    plan = [PlanItem(p, False, "code") for p in PROMPTS]
    bf16 = copy.deepcopy(target).to(torch.bfloat16)  # the fixture's model is shared: cast a copy
    first = run_responses(bf16, tiny_tokenizer, plan[:4], tmp_path, _config(num_prompts=4), batch_size=2)
    assert first["weights_dtype"] == "bfloat16" and first["shards_written"] == 2
    rest = run_responses(target, tiny_tokenizer, plan, tmp_path, _config(), batch_size=2)
    assert rest["weights_dtype"] == "float32" and rest["shards_written"] == 1
    assert [s.weights_dtype for s in load_responses(tmp_path)] == ["bfloat16", "bfloat16", "float32"]
    old = tmp_path / "shard-00000.npz"
    with np.load(old) as z:
        arrays = {k: z[k] for k in z.files if k != "weights_dtype"}
    np.savez_compressed(old, **arrays)
    assert load_responses(tmp_path)[0].weights_dtype == "float32"


def test_the_command_answers_an_evaluation_set_with_a_target_directory(tiny_pair_dirs, tmp_path, capsys):
    """`acchead-distill responses --target DIR --prompts humaneval`: the whole set is the plan (no
    `--num-prompts` cut), too-long prompts skipped and counted, the rest answered into shards."""
    target_dir, _ = tiny_pair_dirs
    out = tmp_path / "eval-humaneval"
    argv = ["responses", "--target", str(target_dir), "--prompts", "humaneval", "--out", str(out),
            "--max-new-tokens", "2", "--max-prompt-tokens", "160", "--batch-size", "32",
            "--threads", "1"]  # fmt: skip
    assert cli.main(argv) == 0
    summary = dict(kv.split("=", 1) for kv in capsys.readouterr().out.split())
    assert summary["prompts"] == "humaneval" and summary["num_prompts"] == "164"
    answered = sum(len(s.plan_index) for s in load_responses(out))
    skipped = int(summary["skipped_long"])
    assert answered > 0 and skipped > 0 and answered + skipped == 164
    assert summary["shards_written"] == "3" and json.loads((out / "responses.json").read_text())["complete"]
