"""acchead-train end to end on a small synthetic gen-data directory: learning, metrics, export, errors."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from gendata_fixture import direct_val_metrics, gen_data  # noqa: F401  (pytest fixture)

from acchead.configs import config_path
from acchead.head_io import load_head
from acchead.train.cli import main as train_main
from acchead.train.metrics import best_constant
from acchead.train.settings import TrainSettings

# The fixture has ~1k training positions: small batches and a high lr give the head enough steps.
FAST = ["--kind", "candidate", "--epochs", "4", "--batch-size", "64", "--lr", "3e-2", "--no-progress",
        "--threads", "1"]  # fmt: skip


@pytest.fixture(scope="module")
def trained(gen_data, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("train_out")
    argv = ["--data", str(gen_data["data"]), "--out", str(out), "--w-rej", "6", "--depth", "2", *FAST]
    assert train_main(argv) == 0
    return out


def test_trained_head_beats_best_constant_on_held_out_prompts(trained):
    m = json.loads((trained / "metrics.json").read_text())
    val = m["val"]
    assert val["positions"] > 50 and m["split"]["val_prompts"] == 4
    # Clearly below the best constant under the same loss (the constant is fitted on the val split itself).
    assert val["weighted_bce"] < 0.7 * val["best_constant"]["weighted_bce"]
    assert val["kl"] < 0.7 * val["best_constant"]["kl"]
    assert val["auroc"] > 0.8
    assert 0 <= val["ece"] < 0.3 and 0 <= val["brier"] < 0.25


def test_metrics_json_equals_direct_computation(gen_data, trained):  # noqa: F811
    m = json.loads((trained / "metrics.json").read_text())["val"]
    ref = direct_val_metrics(gen_data["data"], trained / "head.safetensors", w_rej=6.0)
    assert m["positions"] == ref["positions"]
    for key in ("kl", "weighted_bce", "brier", "auroc"):
        assert m[key] == pytest.approx(ref[key], rel=1e-4, abs=1e-5), key


def test_exported_head_is_tied_to_draft_and_sampling(gen_data, trained):  # noqa: F811
    cfg = json.loads((gen_data["data"] / "gen_config.json").read_text())
    head, meta = load_head(trained / "head.safetensors", draft=cfg["draft"])
    assert (meta.depth, meta.hidden_size, meta.w_acc, meta.w_rej) == (2, 32, 1.0, 6.0)
    assert meta.draft == cfg["draft"] and meta.sampling == cfg["sampling"]
    assert meta.data["mix_ratio"] == 0.15 and meta.data["val_prompts"] == 4
    assert meta.extra["training"]["lr"] == 3e-2
    assert len(head.blocks) == 2
    # Checkpoints hold the head only; logs are CSV.
    ckpt = torch.load(trained / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["state_dict"] and all(k.startswith("head.") for k in ckpt["state_dict"])
    assert list((trained / "logs").rglob("metrics.csv"))
    resolved = yaml.safe_load((trained / "train_config.yaml").read_text())
    assert resolved["depth"] == 2 and resolved["batch_size"] == 64


def test_best_constant_is_the_minimum_over_constants():
    labels = torch.tensor([0.0, 0.2, 1.0, 1.0, 0.7, 0.05])
    w_rej = 6.0
    c = best_constant(labels, w_rej=w_rej)
    grid = torch.linspace(1e-4, 1 - 1e-4, 20001, dtype=torch.float64)
    p = labels.double()[None]
    losses = -(p * torch.log(grid[:, None]) + w_rej * (1 - p) * torch.log(1 - grid[:, None])).mean(1)
    assert c["weighted_bce"] == pytest.approx(losses.min().item(), rel=1e-6)
    assert c["sigma_weighted_bce"] == pytest.approx(grid[losses.argmin()].item(), abs=1e-3)
    kl = (
        p * torch.log(p.clamp(min=1e-12) / grid[:, None])
        + (1 - p) * torch.log((1 - p).clamp(min=1e-12) / (1 - grid[:, None]))
    ).mean(1)
    assert c["kl"] == pytest.approx(kl.min().item(), rel=1e-5, abs=1e-7)


def test_shipped_config_covers_every_setting_with_comments():
    path = config_path("train")
    cfg = yaml.safe_load(path.read_text())
    fields = {f.name for f in dataclasses.fields(TrainSettings)} - {"extra"}
    assert set(cfg) == fields
    for line in path.read_text().splitlines():
        if line and not line.startswith((" ", "#")):
            assert "#" in line, f"uncommented key: {line}"
    TrainSettings(**{**cfg, "data": "x", "out": "y"}).check()


def _run(argv: list[str], capsys) -> tuple[int, str]:
    rc = train_main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    return rc, err[-1] if err else ""


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--w-rej", "0"], "--w-rej must be > 0"),
        (["--w-rej", "-2"], "--w-rej must be > 0"),
        (["--depth", "-1"], "--depth must be >= 0"),
        (["--width", "0"], "--width must be >= 1"),
        (["--betas", "1.5", "0.9"], "--betas must be two numbers in [0, 1)"),  # a traceback in the optimiser
        (["--num-nodes", "0"], "--num-nodes must be >= 1"),  # one from Lightning's Trainer
    ],
)
def test_bad_hyperparameters_are_one_line_errors(gen_data, tmp_path, capsys, flags, message):  # noqa: F811
    rc, err = _run(["--data", str(gen_data["data"]), "--out", str(tmp_path), *flags], capsys)
    assert rc == 2 and message in err and "Traceback" not in err


def _corrupt(src: Path, dst: Path, how: str) -> Path:
    shutil.copytree(src, dst)
    cfg_file = dst / "gen_config.json"
    cfg = json.loads(cfg_file.read_text())
    if how == "other-draft-cache":
        cfg["features"]["draft"] = {**cfg["features"]["draft"], "fingerprint": "feedfacefeedface"}
    elif how == "wrong-width":
        arr = np.load(dst / "features.npy")
        np.save(dst / "features.npy", np.concatenate([arr, arr], axis=1))
    elif how == "stale-cache":
        np.save(dst / "features.npy", np.load(dst / "features.npy")[:-5])
    elif how == "not-gen-data":
        cfg["format"] = "something-else"
    elif how == "old-version":
        cfg["version"] = -1
    elif how == "no-sampling":
        del cfg["sampling"]
    elif how == "cache-missing":
        (dst / "features.npy").unlink()
    elif how == "cache-garbage":
        (dst / "features.npy").write_bytes(b"not an npy file")
    elif how.startswith("no-cache"):
        del cfg["features"]
    elif how in ("labels-outside", "offsets-past"):
        column, value = ("accept_prob", 1.5) if how == "labels-outside" else ("feature_offset", 10**6)
        import datasets

        ds = datasets.load_from_disk(str(src))
        rows = ds.to_list()
        rows[0][column] = [value] * len(rows[0][column]) if column == "accept_prob" else value
        for f in [*dst.glob("*.arrow"), dst / "state.json", dst / "dataset_info.json"]:
            f.unlink()
        datasets.Dataset.from_list(rows, features=ds.features).save_to_disk(str(dst))
    if how == "bad-json":
        cfg_file.write_text("{not json")
    else:
        cfg_file.write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("other-draft-cache", "feature cache of another draft"),
        ("wrong-width", "head/draft hidden-size mismatch"),
        ("stale-cache", "belongs to another gen-data run"),
        ("not-gen-data", "is not an acchead-gen-data output"),
        ("bad-json", "gen_config.json is not valid JSON"),
        ("old-version", "gen-data version -1 is not supported"),
        ("no-sampling", "has no 'sampling' section"),
        ("cache-missing", "lists a feature cache but features.npy is missing"),
        ("cache-garbage", "cannot read feature cache"),
        ("no-cache", "on-the-fly features need the draft 'llama' the data was generated with: pass --draft"),
        ("no-cache-cached", "has no feature cache; use --features on-the-fly"),
        ("labels-outside", "accept_prob values outside [0, 1]"),
        ("offsets-past", "feature_offset does not index features.npy"),
    ],
)
def test_bad_data_directories_are_one_line_errors(gen_data, tmp_path, capsys, how, message):  # noqa: F811
    data = _corrupt(gen_data["data"], tmp_path / "data", how)
    argv = ["--data", str(data), "--out", str(tmp_path / "out"), "--kind", "candidate", "--no-progress"]
    rc, err = _run([*argv, *(["--features", "cached"] if how == "no-cache-cached" else [])], capsys)
    assert rc == 2 and message in err, err


def test_missing_and_empty_directories(tmp_path, capsys):
    rc, err = _run(["--data", str(tmp_path / "nope"), "--out", str(tmp_path / "o")], capsys)
    assert rc == 2 and "does not exist" in err
    (tmp_path / "empty").mkdir()
    rc, err = _run(["--data", str(tmp_path / "empty"), "--out", str(tmp_path / "o")], capsys)
    assert rc == 2 and "not an acchead-gen-data output" in err
    (tmp_path / "empty" / "gen_run.json").write_text("{}")  # a gen-data run killed before its merge
    rc, err = _run(["--data", str(tmp_path / "empty"), "--out", str(tmp_path / "o")], capsys)
    assert rc == 2 and "unfinished acchead-gen-data run: rerun its command" in err


def test_draft_other_than_the_caches_is_refused(gen_data, tmp_path, capsys):  # noqa: F811
    from gendata_fixture import tiny_draft

    tiny_draft(tmp_path / "other", seed=1)  # same shape, other weights
    argv = ["--data", str(gen_data["data"]), "--out", str(tmp_path / "o"), "--kind", "candidate",
            "--draft", str(tmp_path / "other")]
    rc, err = _run(argv, capsys)
    assert rc == 2 and "is not the draft the data was generated with" in err


@pytest.mark.parametrize("cli", ["acchead.train.cli", "acchead.train.sweep"])
def test_bad_data_dir_fails_before_torch_loads(cli, tmp_path):
    # The first thing a user gets wrong fails in a fraction of a second: no torch or lightning import first.
    import subprocess
    import sys

    code = (f"import sys\nfrom {cli} import main\n"
            f"rc = main(['--data', {str(tmp_path / 'none')!r}, '--out', {str(tmp_path / 'out')!r}])\n"
            "print(rc, 'torch' in sys.modules, 'lightning' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["2", "False", "False"], out.stderr
    assert f"data directory does not exist: {tmp_path / 'none'}" in out.stderr


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        ("w_rej: abc\n", "w_rej must be a number, got 'abc'"),  # a TypeError in check() before
        ("depth: '3'\n", "depth must be an integer"),
        ("betas: 0.9\n", "betas must be a list"),  # not iterable
        ("extra: 5\n", "extra must be a mapping"),  # failed after training, writing the head
        ("checkpoints: 'no'\n", "checkpoints must be true or false"),
        ("ece_bins: 0\n", "ece_bins must be >= 1"),
        ("betas: [0.9, x]\n", "--betas must be two numbers in [0, 1)"),
    ],
)
def test_a_config_value_of_the_wrong_type_is_one_line(gen_data, tmp_path, capsys, yaml_text, message):  # noqa: F811
    config = tmp_path / "c.yaml"
    config.write_text(yaml_text)
    rc, err = _run(["--data", str(gen_data["data"]), "--out", str(tmp_path / "o"), "--config", str(config)],
                   capsys)  # fmt: skip
    assert rc == 2 and message in err, err
    config.write_text("devices: 1\nprecision: 32\nbetas: [0.9, 0.99]\nw_rej: 6\n")  # Lightning's forms, ints
    from acchead.train.cli import build_parser, resolve_settings

    args = build_parser().parse_args(["--data", "d", "--out", "o", "--config", str(config)])
    settings = TrainSettings(**resolve_settings(args))
    assert (settings.devices, settings.precision, settings.betas, settings.w_rej) == (1, 32, (0.9, 0.99), 6)


@pytest.mark.parametrize("flag", [["--accelerator", "foo"], ["--precision", "foo"], ["--strategy", "foo"]])
def test_settings_lightning_refuses_are_one_line_and_leave_out_free(gen_data, tmp_path, capsys, flag):  # noqa: F811
    """Lightning checks these flags when it builds the Trainer, after the data loaded and OUT was claimed:
    its refusal is one line, and OUT is left empty, so the corrected command is a new run, not a conflict."""
    out = tmp_path / "o"
    rc, err = _run(["--data", str(gen_data["data"]), "--out", str(out), *FAST, *flag], capsys)
    assert rc == 2 and f"{flag[0]} foo" in err and "Traceback" not in err, err
    assert train_main(["--data", str(gen_data["data"]), "--out", str(out), *FAST, "--epochs", "1"]) == 0


def test_an_out_that_holds_the_data_is_refused_even_with_overwrite(gen_data, tmp_path, capsys):  # noqa: F811
    """`--out` given the `--data` directory (or a folder above it): `--overwrite` would delete the data."""
    from acchead.train.sweep import main as sweep_main

    data = tmp_path / "runs" / "data"
    shutil.copytree(gen_data["data"], data)
    before = sorted(p.name for p in data.iterdir())
    for main in (train_main, sweep_main):
        for out in (data, data.parent):
            assert main(["--data", str(data), "--out", str(out), "--overwrite", "--kind", "candidate"]) == 2
            assert "holds the input --data" in capsys.readouterr().err
    assert sorted(p.name for p in data.iterdir()) == before
