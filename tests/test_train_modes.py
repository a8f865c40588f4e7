"""Batching, the by-prompt split, on-the-fly features (the frozen draft), resume, and the sweep."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from gendata_fixture import gen_data  # noqa: F401  (pytest fixture)
from lightning.pytorch.callbacks import Callback

from acchead.train.data import load_gen_data, split_by_prompt
from acchead.train.datamodule import CachedPositions, IndexBatches, SequenceRows
from acchead.train.draft import FrozenDraft
from acchead.train.fit import train_head
from acchead.train.settings import TrainSettings
from acchead.train.sweep import main as sweep_main


def _settings(gen_data, **kw) -> TrainSettings:  # noqa: F811
    base = dict(
        data=str(gen_data["data"]),
        out=None,
        kind="candidate",  # the fixture's labels are a function of candidate states
        epochs=2,
        batch_size=64,
        lr=3e-2,
        depth=1,
        progress=False,
        logger=None,
        checkpoints=False,
        threads=1,
    )
    return TrainSettings(**{**base, **kw})


def test_split_is_by_prompt_and_seeded():
    prompt_index = np.repeat(np.arange(50), 3)
    val = split_by_prompt(prompt_index, 0.2, seed=1)
    assert val.sum() == 30  # 10 prompts x 3 rows
    for p in range(50):
        assert len(set(val[prompt_index == p])) == 1  # never split inside a prompt
    assert np.array_equal(val, split_by_prompt(prompt_index, 0.2, seed=1))
    assert not np.array_equal(val, split_by_prompt(prompt_index, 0.2, seed=2))


@pytest.mark.parametrize("world", [1, 2, 3])
def test_index_batches_shard_across_ranks(world):
    items = np.arange(100, 203)
    train = [IndexBatches(items, 8, shuffle=True, seed=0, rank=r, world_size=world) for r in range(world)]
    for s in train:
        s.set_epoch(4)
    batches = [list(s) for s in train]
    assert len({len(b) for b in batches}) == 1 and len(batches[0]) == len(train[0])  # same steps per rank
    seen = np.concatenate([np.concatenate(b) for b in batches])
    assert set(seen) == set(items) and len(seen) - len(items) < world  # wrap-around padding only
    again = IndexBatches(items, 8, shuffle=True, seed=0, rank=0, world_size=world)
    again.set_epoch(4)
    assert all(np.array_equal(a, b) for a, b in zip(again, batches[0], strict=True))  # (seed, epoch) decides
    evals = [
        np.concatenate(list(IndexBatches(items, 8, False, rank=r, world_size=world))) for r in range(world)
    ]
    assert sorted(np.concatenate(evals).tolist()) == items.tolist()  # evaluation: every item exactly once


def test_on_the_fly_features_equal_the_cache(gen_data):  # noqa: F811
    cached = load_gen_data(gen_data["data"], "cached")
    fly = load_gen_data(gen_data["data"], "on-the-fly")
    rows = np.arange(0, 12)
    batch = SequenceRows(fly)[rows]
    draft = FrozenDraft.load(gen_data["draft"])
    hidden = draft(batch["input_ids"], batch["attention_mask"])[batch["target_mask"]]
    positions = np.flatnonzero(np.isin(cached.row, rows))
    ref = CachedPositions(cached)[positions]
    assert torch.equal(batch["labels"][batch["target_mask"]], ref["labels"])
    assert torch.allclose(hidden, ref["features"].float(), atol=2e-2, rtol=1e-2)  # float16 cache


def test_on_the_fly_training_keeps_the_draft_out_of_state_and_optimizer(gen_data, tmp_path):  # noqa: F811
    s = _settings(
        gen_data,
        features="on-the-fly",
        draft=str(gen_data["draft"]),
        batch_sequences=8,
        out=str(tmp_path),
        checkpoints=True,
        epochs=1,
    )
    result = train_head(s)
    module = result.module
    assert all(k.startswith("head.") for k in module.state_dict())
    head_params = {id(p) for p in module.head.parameters()}
    assert {id(p) for p in module.parameters()} == head_params  # DDP would sync only these
    assert not any(p.requires_grad for p in module.draft.model.parameters())
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert all(k.startswith("head.") for k in ckpt["state_dict"])
    assert result.metrics["features"] == "on-the-fly" and result.metrics["val"]["positions"] > 50


def test_on_the_fly_without_a_draft_is_a_one_line_error(gen_data):  # noqa: F811
    from acchead.errors import AccheadError

    with pytest.raises(AccheadError, match="pass --draft PATH"):
        train_head(_settings(gen_data, features="on-the-fly"))


@pytest.mark.parametrize("features", ["on-the-fly", "cached"])
def test_pair_draft_is_checked_against_the_data_like_draft(gen_data, features):  # noqa: F811
    """`--pair toy` stands for `--draft <the toy pair's draft>`: this data's draft is another, so it is
    refused in one line naming the flag, on the fly and against a feature cache alike."""
    from acchead.errors import AccheadError

    with pytest.raises(AccheadError, match=r"--pair toy has hidden size 128, the data.s draft"):
        train_head(_settings(gen_data, features=features, pair="toy"))


def test_train_parser_takes_a_pair():
    from acchead.train.cli import build_parser

    assert build_parser().parse_args(["--data", "d", "--pair", "smollm2"]).pair == "smollm2"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--data", "d", "--pair", "nope"])


class _StopAfterFirstEpoch(Callback):
    def on_train_epoch_end(self, trainer, pl_module) -> None:
        trainer.should_stop = True


def test_resume_continues_exactly_where_the_run_stopped(gen_data, tmp_path):  # noqa: F811
    full = train_head(_settings(gen_data, epochs=2))
    out = str(tmp_path / "run")
    first = train_head(
        _settings(gen_data, epochs=2, out=out, checkpoints=True), callbacks=[_StopAfterFirstEpoch()]
    )
    assert (
        first.module.trainer.current_epoch == 1 and first.metrics["global_step"] < full.metrics["global_step"]
    )
    resumed = train_head(_settings(gen_data, epochs=2, out=out, checkpoints=True, resume="last"))
    assert resumed.metrics["global_step"] == full.metrics["global_step"]
    for (name, a), b in zip(
        full.module.head.state_dict().items(), resumed.module.head.state_dict().values(), strict=True
    ):
        assert torch.allclose(a, b, atol=1e-6), name


def test_resume_with_another_depth_or_width_is_refused(gen_data, tmp_path):  # noqa: F811
    from acchead.errors import AccheadError

    out = str(tmp_path / "run")
    train_head(_settings(gen_data, epochs=1, out=out, checkpoints=True))
    with pytest.raises(AccheadError, match="depth mismatch"):
        train_head(_settings(gen_data, epochs=2, out=out, checkpoints=True, resume="last", depth=2))
    with pytest.raises(AccheadError, match="width mismatch"):
        train_head(_settings(gen_data, epochs=2, out=out, checkpoints=True, resume="last", width=8))


def test_sweep_writes_table3_markdown_and_json(gen_data, tmp_path, capsys):  # noqa: F811
    argv = [
        "--data",
        str(gen_data["data"]),
        "--out",
        str(tmp_path),
        "--kind",
        "candidate",
        "--w-rej",
        "1",
        "6",
        "--depth",
        "0",
        "2",
        "--epochs",
        "2",
        "--batch-size",
        "128",
        "--lr",
        "3e-2",
        "--threads",
        "1",
    ]
    assert sweep_main(argv) == 0
    table = (tmp_path / "sweep.md").read_text()
    assert "| w_rej \\ depth | D=0 | D=2 |" in table and "wall time" in table
    rows = [line for line in table.splitlines() if line.startswith(("| 1 |", "| 6 |"))]
    assert len(rows) == 2 and all(line.count(" / ") == 2 for line in rows)
    result = json.loads((tmp_path / "sweep.json").read_text())
    assert len(result["cells"]) == 4 and result["wall_seconds"] > 0
    assert {(c["w_rej"], c["depth"]) for c in result["cells"]} == {(1, 0), (1, 2), (6, 0), (6, 2)}
    assert (tmp_path / "heads" / "wrej6_depth2" / "head.safetensors").is_file()
    for c in result["cells"]:  # the table shows the JSON's numbers, and every head learned something
        assert f"{c['train_kl']:.4f} / {c['eval_kl']:.4f}" in table
        assert c["eval_kl"] < c["eval_best_constant"]["kl"]


def test_sweep_locks_out_resumes_finished_cells_and_refuses_other_flags(gen_data, tmp_path, capsys):  # noqa: F811
    """A killed sweep keeps its finished cells (cell.json written last); other flags need --overwrite."""
    from acchead.rundir import DirLock

    out = tmp_path / "sweep"
    argv = ["--data", str(gen_data["data"]), "--out", str(out), "--w-rej", "1", "6", "--depth", "0",
            "--kind", "candidate", "--epochs", "1", "--batch-size", "128", "--threads", "1"]  # fmt: skip
    with DirLock(out, "another process"):  # a live sweep holds OUT: one line, exit 2, nothing trained
        assert sweep_main(argv) == 2
    assert "is in use by another" in capsys.readouterr().err and not (out / "heads").exists()
    assert sweep_main(argv) == 0
    assert json.loads((out / "sweep_run.json").read_text())["complete"]
    first = json.loads((out / "sweep.json").read_text())["cells"]
    # As if killed after the first cell: the run is incomplete and the second cell's record is gone.
    manifest = json.loads((out / "sweep_run.json").read_text())
    (out / "sweep_run.json").write_text(json.dumps({**manifest, "complete": False}))
    (out / "heads" / "wrej6_depth0" / "cell.json").unlink()
    kept = (out / "heads" / "wrej1_depth0" / "head.safetensors").stat().st_mtime_ns
    capsys.readouterr()
    assert sweep_main(argv) == 0
    err = capsys.readouterr().err
    assert "w_rej=6 depth=0" in err and "w_rej=1 depth=0" not in err  # only the unfinished cell trained
    assert (out / "heads" / "wrej1_depth0" / "head.safetensors").stat().st_mtime_ns == kept
    again = json.loads((out / "sweep.json").read_text())["cells"]
    assert [c["w_rej"] for c in again] == [1.0, 6.0] and again[0] == first[0]
    assert sweep_main(argv) == 0 and "already holds this sweep, complete" in capsys.readouterr().err
    assert sweep_main([*argv, "--epochs", "2"]) == 2
    assert "holds a different sweep run (differs in: epochs)" in capsys.readouterr().err
    assert sweep_main([*argv, "--epochs", "2", "--overwrite"]) == 0


def test_features_benchmark_times_both_modes_over_the_same_positions(gen_data, capsys):  # noqa: F811
    """`python -m acchead.train.bench_features` (docs/sweep.md): one epoch cached and one on the fly, on the
    same training positions; it prints both timings and their ratio, and refuses a draft unlike the data's."""
    from acchead.train.bench_features import main as bench_main

    args = ["--data", str(gen_data["data"]), "--draft", str(gen_data["draft"]), "--accelerator", "cpu",
            "--depth", "1", "--batch-sequences", "16"]  # fmt: skip
    assert bench_main(args) == 0
    out = capsys.readouterr().out
    cached = load_gen_data(gen_data["data"], "cached")
    val = split_by_prompt(cached.prompt_index, 0.1, 0)
    n = int((~val[cached.row]).sum())  # the training split's Y-positions
    assert f"one epoch over {n} training Y-positions" in out and "hidden size 32" in out
    assert "cached features:" in out and "on the fly:" in out and "ratio on-the-fly / cached:" in out
    other = gen_data["root"] / "other_draft"
    from gendata_fixture import tiny_draft

    tiny_draft(other, seed=1)  # same shape, other weights: not the data's draft
    assert bench_main([*args[:2], "--draft", str(other), *args[4:]]) == 2  # a user error: one line
    assert "--draft" in capsys.readouterr().err


def test_sweep_trains_lookahead_heads_by_default(gen_data, tmp_path):  # noqa: F811
    """The sweep's default kind is acchead-train's (lookahead): it loaded the data for candidate heads and
    refused every run that did not say --kind candidate."""
    from acchead.head_io import load_head

    argv = ["--data", str(gen_data["data"]), "--out", str(tmp_path), "--w-rej", "3", "--depth", "0",
            "--epochs", "1", "--features", "on-the-fly", "--draft", str(gen_data["draft"]),
            "--threads", "1"]  # fmt: skip
    assert sweep_main(argv) == 0
    head, _ = load_head(tmp_path / "heads" / "wrej3_depth0" / "head.safetensors")
    assert head.kind == "lookahead"
