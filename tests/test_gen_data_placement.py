"""Which GPUs each gen-data process shards its target over (acchead.data_gen.placement).

The assignment and its refusals are pure functions, tested without GPUs; the last test (marked `gpu`,
for a machine with an even number of GPUs) runs 2 processes that each shard their own target.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from acchead.data_gen.config import parse_args
from acchead.data_gen.placement import Placement, parse_process_gpus, placement, process_gpus
from acchead.errors import AccheadError

GIB = 2**30


@pytest.mark.parametrize(
    ("num_processes", "num_gpus", "expected"),
    [
        (1, 8, [list(range(8))]),
        (2, 8, [[0, 1, 2, 3], [4, 5, 6, 7]]),
        (4, 8, [[0, 1], [2, 3], [4, 5], [6, 7]]),
        (8, 8, [[g] for g in range(8)]),
        (3, 6, [[0, 1], [2, 3], [4, 5]]),
    ],
)
def test_contiguous_groups_cover_every_gpu_once(num_processes, num_gpus, expected):
    groups = [process_gpus(r, num_processes, num_gpus) for r in range(num_processes)]
    assert groups == expected


@pytest.mark.parametrize(
    ("num_processes", "num_gpus", "message"),
    [
        (3, 8, "8 GPUs do not split evenly over 3 processes"),
        (4, 2, "4 processes cannot each shard"),
        (2, 0, "no GPU is visible"),
    ],
)
def test_impossible_splits_are_refused(num_processes, num_gpus, message):
    with pytest.raises(AccheadError, match=message):
        process_gpus(0, num_processes, num_gpus)


def test_a_user_mapping_is_used_and_checked():
    mapping = parse_process_gpus("0,1,2;3,4,5")
    assert mapping == [[0, 1, 2], [3, 4, 5]]
    assert [process_gpus(r, 2, 8, mapping) for r in (0, 1)] == mapping  # GPUs 6 and 7 stay free
    assert process_gpus(0, 1, 8, [[5]]) == [5]
    with pytest.raises(AccheadError, match="2 GPU groups for 3 processes"):
        process_gpus(0, 3, 8, mapping)
    with pytest.raises(AccheadError, match="names GPU 4, but 4 are visible"):
        process_gpus(0, 2, 4, mapping)
    for text, message in [
        ("0,1;1,2", "GPU 1 is given to more than one process"),
        ("0,a", "expected GPU indices"),
        ("0,1;", "expected GPU indices"),
        ("-1", ">= 0"),
    ]:
        with pytest.raises(AccheadError, match=message):
            parse_process_gpus(text)


def test_placement_restricts_each_process_to_its_gpus():
    free = {g: (g + 1) * 10 * GIB for g in range(8)}
    p = placement("auto", None, 1, 4, 8, free.__getitem__)
    assert p.device_map == "auto" and p.draft_device == "cuda:2"
    assert p.max_memory == {2: int(0.9 * free[2]), 3: int(0.9 * free[3])}  # no other GPU, no CPU offload
    p = placement("balanced", [[6, 7], [0]], 1, 2, 8, free.__getitem__)
    assert p.max_memory == {0: int(0.9 * free[0])} and p.draft_device == "cuda:0"


def test_one_process_and_no_device_map_keep_their_behaviour():
    never = lambda gpu: pytest.fail("free memory is not asked for")  # noqa: E731
    assert placement(None, None, 0, 2, 8, never) == Placement(None, None, None)
    # One process: transformers shards over every visible GPU, as before.
    assert placement("auto", None, 0, 1, 8, never) == Placement("auto", None, None)
    with pytest.raises(AccheadError, match="give --device-map too"):
        placement(None, [[0]], 0, 1, 8, never)
    with pytest.raises(AccheadError, match="give a strategy"):
        placement('{"": 0}', None, 0, 2, 8, never)


def test_process_gpus_flag_parses_and_refuses_bad_syntax():
    args = parse_args(["--process-gpus", "0,1;2,3", "--device-map", "auto"])
    assert args.process_gpus == [[0, 1], [2, 3]] and args.device_map == "auto"
    assert parse_args([]).process_gpus is None
    with pytest.raises(AccheadError, match="expected GPU indices"):
        parse_args(["--process-gpus", "0;x"])


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2 or torch.cuda.device_count() % 2,
    reason="needs an even number (>= 2) of CUDA devices",
)
def test_two_processes_each_shard_the_target_over_their_own_gpus(tiny_pair_dirs, tmp_path):
    """accelerate launch --num_processes 2 --device-map auto: process r's target stays on its half of the
    GPUs, and labels from the online run's responses equal the online labels (one process, all GPUs)."""
    from test_gen_data_cli import PROMPTS, REPO, base_args, read_run, write_jsonl

    from acchead.data_gen import cli

    gpus = torch.cuda.device_count()
    prompts = write_jsonl(tmp_path / "p.jsonl", PROMPTS)
    emitted = tmp_path / "responses.jsonl"
    online = tmp_path / "online"
    argv = base_args(tiny_pair_dirs, prompts, online, "--device-map", "auto")
    assert cli.main([*argv, "--emit-responses", str(emitted)]) == 0
    two = tmp_path / "two"
    argv = base_args(tiny_pair_dirs, prompts, two, "--device-map", "auto")
    argv[argv.index("--prompts") : argv.index("--prompts") + 2] = ["--responses", str(emitted)]
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--multi_gpu",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]  # fmt: skip
    res = subprocess.run(
        [*launch, "-m", "acchead.data_gen.cli", *argv], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stderr[-2000:]
    half = gpus // 2
    for rank, group in enumerate((list(range(half)), list(range(half, gpus)))):
        line = next(x for x in res.stderr.splitlines() if x.startswith(f"gen-data process {rank}: target"))
        assert f"(budget on {group}), draft on cuda:{group[0]}" in line, line
    a, b = read_run(online), read_run(two)
    for key in ("prompt_index", "response_ids", "draft_ids", "mixed_ids", "from_draft"):
        assert a[0][key] == b[0][key], key
    for x, y in zip(a[0]["accept_prob"], b[0]["accept_prob"], strict=True):
        np.testing.assert_allclose(y, x, atol=1e-5, rtol=0)
