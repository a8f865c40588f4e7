"""DDP on CPU: 2 processes (gloo) train one head; validation metrics synchronised across them are exact."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
from gendata_fixture import direct_val_metrics, gen_data  # noqa: F401  (pytest fixture)


@pytest.mark.slow
def test_ddp_two_cpu_processes_train_and_sync_metrics(gen_data, tmp_path):  # noqa: F811
    out = tmp_path / "ddp"
    cmd = [
        sys.executable,
        "-m",
        "acchead.train.cli",
        "--data",
        str(gen_data["data"]),
        "--out",
        str(out),
        "--kind",
        "candidate",
        "--w-rej",
        "6",
        "--depth",
        "1",
        "--epochs",
        "2",
        "--batch-size",
        "64",
        "--lr",
        "3e-2",
        "--strategy",
        "ddp",
        "--accelerator",
        "cpu",
        "--devices",
        "2",
        "--threads",
        "1",
        "--no-progress",
    ]
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = json.loads((out / "metrics.json").read_text())
    # Each rank stepped over half of the (padded) training positions per epoch.
    assert m["global_step"] == 2 * math.ceil(math.ceil(m["train"]["positions"] / 2) / 64)
    # The torchmetrics values gathered from both ranks equal a single-process computation on the whole split.
    ref = direct_val_metrics(gen_data["data"], out / "head.safetensors", w_rej=6.0)
    assert m["val"]["positions"] == ref["positions"]
    for key in ("kl", "weighted_bce", "brier", "auroc"):
        assert m["val"][key] == pytest.approx(ref[key], rel=1e-4, abs=1e-5), key
    assert m["val"]["weighted_bce"] < m["val"]["best_constant"]["weighted_bce"]
