"""Fault injection (issue 12): kills and interrupts at any point, two processes on one --out, another run's
--out, and bad inputs. Every rerun after a fault must produce what an uninterrupted run produces, and every
bad input must be one line (`prog: error: ...`) with a non-zero exit and no traceback.

This module holds the in-process checks (simulated kills, held locks); `test_faults_processes.py` (`-m
slow`) kills real processes with SIGKILL / SIGINT at random points.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gendata_fixture import gen_data  # noqa: F401  (pytest fixture)
from test_gen_data_cli import PROMPTS, base_args, read_run, write_jsonl

from acchead.data_gen import cli as gen_cli
from acchead.data_gen.labeler import Labeler
from acchead.data_gen.part_writer import PartWriter
from acchead.data_gen.shards import RunDir
from acchead.head import AcceptanceHead
from acchead.head_io import HeadMetadata, load_head, save_head
from acchead.inference.bench import run as bench_cli
from acchead.models import load_causal_lm, model_identity
from acchead.rundir import LOCK_NAME, DirLock, start
from acchead.train import cli as train_cli
from acchead.train.fit import RunCheckpoint

REPO = Path(__file__).resolve().parents[1]
# One thread like this process (conftest): same kernels, same bits.
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def one_error_line(err: str, prog: str) -> str:
    """The single line of a refused input: `prog: error: ...`, alone on stderr, no traceback."""
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), err
    return lines[0]


# ------------------------------------------------------------------------------------------------ gen-data


@pytest.fixture
def prompts_file(tmp_path) -> Path:
    return write_jsonl(tmp_path / "prompts.jsonl", PROMPTS)


@pytest.fixture
def gen_reference(tiny_pair_dirs, prompts_file, tmp_path):
    """An uninterrupted gen-data run (default flush settings)."""
    out = tmp_path / "ref"
    assert gen_cli.main(base_args(tiny_pair_dirs, prompts_file, out)) == 0
    return read_run(out)


def _same_run(a, b) -> None:
    assert a[0] == b[0], "rows differ"
    assert np.array_equal(a[1], b[1]) and a[1].dtype == b[1].dtype == np.float16, "feature cache differs"
    assert a[2] == b[2], "gen_config differs"


def test_part_writer_flushes_by_size_by_time_and_at_gaps(tmp_path):
    now = [0.0]
    written = []

    class FakeDir:
        def write_shard(self, part, rows, hidden):
            written.append((part, list(rows)))

    w = PartWriter(FakeDir(), None, max_prompts=4, max_seconds=60, clock=lambda: now[0])  # type: ignore[arg-type]
    w.add(0, ["a", "b"])
    w.add(1, ["c", "d"])  # 4 prompts: size
    now[0] = 61.0
    w.add(2, ["e"])  # 61 s since the last write: time
    w.add(3, ["f"])
    w.add(5, ["g"])  # batch 4 is not ours (resumed run): the part [3, 4) ends first
    w.close()
    assert [p for p, _ in written] == [(0, 2), (2, 3), (3, 4), (5, 6)]
    assert [r for _, rows in written for r in rows] == list("abcdefg")


def test_feature_cache_and_rows_do_not_depend_on_shard_size_or_flush(tiny_pair_dirs, prompts_file, tmp_path):
    # Batches are planned over the whole run: per-shard planning changed batch composition, hence rounding.
    runs = []
    for name, extra in (("a", ["--shard-size", "1"]), ("b", ["--shard-size", "256", "--flush-seconds", "0"]),
                        ("c", ["--shard-size", "7", "--batch-size", "3"])):  # fmt: skip
        out = tmp_path / name
        assert gen_cli.main(base_args(tiny_pair_dirs, prompts_file, out, *extra)) == 0
        runs.append(read_run(out))
        _check_feature_rows(out)
    _same_run(runs[0], runs[1])
    _same_run(runs[0], runs[2])
    la = [np.load(tmp_path / name / "lookahead_features.npy") for name in "abc"]
    assert np.array_equal(la[0], la[1]) and np.array_equal(la[0], la[2])


def _check_feature_rows(out: Path) -> None:
    """Both feature caches are in dataset row order: the state after Z_j, which the candidate cache holds
    for each from-draft j, is the lookahead cache's state before position j + 1 of the same row."""
    rows, feats, _ = read_run(out)
    look = np.load(out / "lookahead_features.npy")
    start = 0
    for fd, offset in zip(rows["from_draft"], rows["feature_offset"], strict=True):
        drafted = np.flatnonzero(fd)
        for k, j in enumerate(drafted):
            if j + 1 < len(fd):
                assert np.array_equal(feats[offset + k], look[start + j + 1])
        start += len(fd)
    assert start == len(look)


def test_gen_data_kill_loses_at_most_the_unflushed_batches(
    tiny_pair_dirs, prompts_file, tmp_path, monkeypatch
):
    """A run far below --shard-size prompts still reaches the disk by time (here: every batch)."""
    ref = tmp_path / "ref"
    assert gen_cli.main(base_args(tiny_pair_dirs, prompts_file, ref, "--shard-size", "256")) == 0
    out = tmp_path / "killed"
    args = base_args(tiny_pair_dirs, prompts_file, out, "--shard-size", "256", "--flush-seconds", "0")
    real_label, labelled = Labeler.label, []

    def label_then_die(self, idx, prompts):
        if len(labelled) >= 6:
            raise RuntimeError("simulated kill")
        labelled.extend(idx)
        return real_label(self, idx, prompts)

    monkeypatch.setattr(Labeler, "label", label_then_die)
    with pytest.raises(RuntimeError, match="simulated kill"):
        gen_cli.main(args)
    first = sorted(labelled)
    labelled.clear()
    monkeypatch.setattr(
        Labeler, "label", lambda self, idx, p: labelled.extend(idx) or real_label(self, idx, p)
    )
    assert gen_cli.main(args) == 0
    assert sorted(labelled) == sorted(set(range(len(PROMPTS))) - set(first)), "labelled batches were kept"
    _same_run(read_run(out), read_run(ref))


def test_truncated_part_is_relabelled_not_a_traceback(
    tiny_pair_dirs, prompts_file, tmp_path, gen_reference, monkeypatch, capsys
):
    out = tmp_path / "crashed"
    args = base_args(tiny_pair_dirs, prompts_file, out)
    real_write, written = RunDir.write_shard, []

    def die_after_three(self, k, rows, hidden):
        if len(written) == 3:
            raise RuntimeError("simulated kill")
        real_write(self, k, rows, hidden)
        written.append(k)

    monkeypatch.setattr(RunDir, "write_shard", die_after_three)
    with pytest.raises(RuntimeError):
        gen_cli.main(args)
    monkeypatch.setattr(RunDir, "write_shard", real_write)
    shards = out / "shards"
    parts = sorted(shards.glob("part-*.arrow"))
    assert len(parts) == 3
    # What a power loss can leave: a truncated rows file, a short feature file, an orphan feature file.
    parts[0].write_bytes(parts[0].read_bytes()[:100])
    npy = parts[1].with_suffix(".npy")
    npy.write_bytes(npy.read_bytes()[:-64])
    (shards / "part-000009-000010.npy").write_bytes(b"orphan")
    capsys.readouterr()
    for _ in range(2):  # and it stays fixed: a second rerun reports the finished run
        assert gen_cli.main(args) == 0
    err = capsys.readouterr().err
    assert err.count("relabelling part-") == 2 and "Traceback" not in err
    _same_run(read_run(out), gen_reference)


def test_gen_data_refuses_a_locked_out_naming_the_holder(tiny_pair_dirs, prompts_file, tmp_path, capsys):
    out = tmp_path / "busy"
    with DirLock(out, "acchead-gen-data"):
        assert gen_cli.main(base_args(tiny_pair_dirs, prompts_file, out)) == 2
    line = one_error_line(capsys.readouterr().err, PROG)
    assert f"pid {os.getpid()}" in line and "in use by acchead-gen-data" in line
    assert gen_cli.main(base_args(tiny_pair_dirs, prompts_file, out)) == 0  # released: runs normally


def test_gen_data_overwrite_replaces_another_run(
    tiny_pair_dirs, prompts_file, tmp_path, gen_reference, capsys
):
    out = tmp_path / "other"
    assert gen_cli.main(base_args(tiny_pair_dirs, prompts_file, out, "--seed", "3")) == 0
    assert gen_cli.main(base_args(tiny_pair_dirs, prompts_file, out)) == 2
    assert "differs in: seed" in capsys.readouterr().err
    assert gen_cli.main(base_args(tiny_pair_dirs, prompts_file, out, "--overwrite")) == 0
    _same_run(read_run(out), gen_reference)


# --------------------------------------------------------------------------------------------------- train

TRAIN_FAST = ["--kind", "candidate", "--epochs", "3", "--batch-size", "64", "--lr", "3e-2", "--depth", "1",
              "--no-progress", "--threads", "1", "--logger", "none"]  # fmt: skip
PROG = Path(sys.argv[0]).name  # what cli_errors prints as the program name in-process


def _train(gen_data, out: Path, *extra: str) -> int:  # noqa: F811
    return train_cli.main(["--data", str(gen_data["data"]), "--out", str(out), *TRAIN_FAST, *extra])


def _head(out: Path) -> dict[str, torch.Tensor]:
    head, _ = load_head(out / "head.safetensors")
    return head.state_dict()


def _same_head(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-6), k


@pytest.fixture(scope="module")
def train_reference(gen_data, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("train_ref") / "run"
    assert _train(gen_data, out) == 0
    return _head(out)


def test_train_refuses_another_run_and_overwrite_replaces_it(gen_data, tmp_path, capsys, train_reference):  # noqa: F811
    out = tmp_path / "run"
    assert _train(gen_data, out, "--lr", "1e-2") == 0
    (out / "checkpoints" / "last-v1.ckpt").write_bytes(b"a stale checkpoint of an older acchead")
    before = (out / "head.safetensors").read_bytes()
    capsys.readouterr()
    assert _train(gen_data, out) == 2
    line = one_error_line(capsys.readouterr().err, PROG)
    assert "holds a different train run (differs in: lr)" in line and "--overwrite" in line
    assert (out / "head.safetensors").read_bytes() == before
    assert _train(gen_data, out, "--overwrite") == 0
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["last.ckpt"]  # stale ones gone
    _same_head(_head(out), train_reference)
    capsys.readouterr()
    assert _train(gen_data, out) == 0  # the same run, complete: reported, not retrained
    assert "already holds this run, complete" in capsys.readouterr().err
    # Neither another stage's output nor foreign files are written into.
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "thesis.txt").write_text("precious")
    assert _train(gen_data, tmp_path / "notes", "--overwrite") == 2
    assert "holds no train run" in capsys.readouterr().err
    assert not (tmp_path / "notes" / LOCK_NAME).exists()


def test_train_ctrl_c_exits_130_in_one_line_and_resumes_exactly(
    gen_data, tmp_path, capsys, monkeypatch, train_reference  # noqa: F811
):
    out = tmp_path / "run"
    real = RunCheckpoint.on_train_batch_end

    def interrupt_at_step_20(self, trainer, module, *args):
        real(self, trainer, module, *args)
        if trainer.global_step == 20:  # mid-epoch 2 (16 steps per epoch), right after a checkpoint
            raise KeyboardInterrupt

    monkeypatch.setattr(RunCheckpoint, "on_train_batch_end", interrupt_at_step_20)
    assert _train(gen_data, out, "--checkpoint-every", "0") == 130
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(f"{PROG}: interrupted: ") and "--resume last" in err
    assert (out / "checkpoints" / "last.ckpt").is_file() and not (out / "head.safetensors").exists()
    monkeypatch.setattr(RunCheckpoint, "on_train_batch_end", real)
    assert _train(gen_data, out, "--checkpoint-every", "0", "--resume", "last") == 0
    _same_head(_head(out), train_reference)  # a mid-epoch resume trains on exactly the batches left


def test_train_killed_mid_epoch_resumes_by_rerunning_the_same_command(
    gen_data, tmp_path, monkeypatch, train_reference  # noqa: F811
):
    out = tmp_path / "run"
    real = RunCheckpoint.on_train_batch_end

    def die_at_step_37(self, trainer, module, *args):
        real(self, trainer, module, *args)
        if trainer.global_step == 37:
            raise RuntimeError("simulated kill")

    monkeypatch.setattr(RunCheckpoint, "on_train_batch_end", die_at_step_37)
    with pytest.raises(RuntimeError, match="simulated kill"):
        _train(gen_data, out, "--checkpoint-every", "0")
    monkeypatch.setattr(RunCheckpoint, "on_train_batch_end", real)
    assert _train(gen_data, out) == 0  # the same settings: it resumes from last.ckpt by itself
    _same_head(_head(out), train_reference)


def test_train_corrupt_checkpoint_and_locked_out_are_one_line(gen_data, tmp_path, capsys):  # noqa: F811
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(b"PK\x03\x04 not really a checkpoint")
    assert _train(gen_data, tmp_path / "a", "--resume", str(bad)) == 2
    assert "is unreadable" in one_error_line(capsys.readouterr().err, PROG)
    with DirLock(tmp_path / "b", "acchead-train"):
        assert _train(gen_data, tmp_path / "b") == 2
    assert f"pid {os.getpid()}" in one_error_line(capsys.readouterr().err, PROG)


# --------------------------------------------------------------------------------------------------- bench


@pytest.fixture(scope="module")
def bench_inputs(tiny_pair_dirs, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fault_bench")
    draft = load_causal_lm(tiny_pair_dirs[1])
    meta = HeadMetadata(depth=1, hidden_size=32, w_acc=1.0, w_rej=6.0, draft=model_identity(draft),
                        sampling={"temperature": 0.0, "top_k": 0, "top_p": 1.0})  # fmt: skip
    head = save_head(AcceptanceHead(32, 1), root / "head.safetensors", meta=meta)
    nan_head = AcceptanceHead(32, 1)
    with torch.no_grad():
        nan_head.out.weight[0, 0] = float("nan")
    save_head(nan_head, root / "nan_head.safetensors", meta=meta)
    prompts = write_jsonl(root / "prompts.jsonl", ["def add(a, b):\n    return", "for i in range(10):\n"])
    long = "x = [" + ", ".join(str(i) for i in range(300)) + "]\n"
    return {"target": tiny_pair_dirs[0], "draft": tiny_pair_dirs[1], "head": head, "prompts": prompts,
            "nan_head": root / "nan_head.safetensors", "binary": _binary(root / "binary.jsonl"),
            "long": write_jsonl(root / "long.jsonl", [long, "y = 1\n"])}  # fmt: skip


def _binary(path: Path) -> Path:
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe binary")
    return path


def _bench_argv(inp, out: Path, *extra: str) -> list[str]:
    return ["--prompts", str(inp["prompts"]), "--target", str(inp["target"]), "--draft", str(inp["draft"]),
            "--head", str(inp["head"]), "--out", str(out), "--max-new-tokens", "6", "--num-prompts", "0",
            "--methods", "autoregressive,specdec", "--k-grid", "1,3", "--overhead-calls", "3",
            *extra]  # fmt: skip


def _counts(out: Path) -> list:
    """Per row of results.json: its spec and counts; then every prompt's runs (counts, output digest)."""
    rows = json.loads((out / "results.json").read_text())["rows"]
    keys = ("tokens", "target_calls", "draft_calls", "discarded", "output_sha")
    runs = {}
    for part in sorted((out / "partial").glob("prompt-*.json")):
        for setting, run in json.loads(part.read_text())["runs"].items():
            runs[(part.name, setting)] = [run[k] for k in keys]
    return [[r["spec"], *(r[k] for k in keys[:4])] for r in rows] + sorted(runs.items())


def test_bench_refuses_another_run_and_overwrite_replaces_it(bench_inputs, tmp_path, capsys):
    out = tmp_path / "bench"
    assert bench_cli.main(_bench_argv(bench_inputs, out)) == 0
    ref = _counts(out)
    before = (out / "results.json").read_text()
    capsys.readouterr()
    assert bench_cli.main(_bench_argv(bench_inputs, out, "--k-grid", "2")) == 2
    line = one_error_line(capsys.readouterr().err, PROG)
    assert "holds a different bench run (differs in: settings)" in line
    assert (out / "results.json").read_text() == before
    assert bench_cli.main(_bench_argv(bench_inputs, out, "--k-grid", "2", "--overwrite")) == 0
    assert [c[0] for c in _counts(out)[:2]] == ["autoregressive", "specdec:k=2"]
    assert {s for (_, s), _ in _counts(out)[2:]} == {"autoregressive-token", "specdec_k=2-token"}
    assert len(list((out / "partial").glob("*.json"))) == 2
    # A gen-data directory is not a bench's.
    gd = tmp_path / "gd"
    start(gd, "gen-data", {"seed": 0})
    capsys.readouterr()
    assert bench_cli.main(_bench_argv(bench_inputs, gd)) == 2
    assert "holds a gen-data run, not a bench run" in one_error_line(capsys.readouterr().err, PROG)
    with DirLock(tmp_path / "busy", "acchead-bench"):
        assert bench_cli.main(_bench_argv(bench_inputs, tmp_path / "busy")) == 2
    assert f"pid {os.getpid()}" in one_error_line(capsys.readouterr().err, PROG)
    assert ref[0] == _counts(tmp_path / "bench")[0]  # autoregressive was recomputed identically


def test_bench_checks_the_cost_fit_before_running(bench_inputs, tmp_path, capsys):
    """Refused before any model loads: the target path does not exist, and the error is the cost fit's."""
    argv = _bench_argv(bench_inputs, tmp_path / "b", "--num-prompts", "1", "--methods",
                       "autoregressive,oracle", "--target", str(tmp_path / "no-such-model"))  # fmt: skip
    assert bench_cli.main(argv) == 2
    line = one_error_line(capsys.readouterr().err, PROG)
    assert "cost fit needs at least 2 runs" in line and "1 prompt(s) x 1 such setting(s)" in line
    assert not (tmp_path / "b").exists()


def test_bench_long_prompt_is_refused_or_truncated_on_request(bench_inputs, tmp_path, capsys):
    argv = _bench_argv(bench_inputs, tmp_path / "b", "--prompts", str(bench_inputs["long"]))
    assert bench_cli.main(argv) == 2
    line = one_error_line(capsys.readouterr().err, PROG)
    assert "prompt 0 has" in line and "--truncate-prompts" in line
    assert bench_cli.main([*argv, "--truncate-prompts"]) == 0
    res = json.loads((tmp_path / "b" / "results.json").read_text())
    [cut] = res["truncated_prompts"]
    assert cut["prompt"] == 0 and cut["kept"] == 250 and cut["tokens"] > 250
    assert res["config"]["truncate_prompts"] is True
