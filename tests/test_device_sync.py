"""The timers' CUDA branches, run on the CPU (issue 32): every timer waits on its device through
`acchead.step_cost.device_sync` before and after each timed call, and the bench judges a CUDA run by the
GPU's goals. `device_sync` is the one line that differs by device: a spy stands in for
`torch.cuda.synchronize` to check it, and for `device_sync` itself to check each timer calls it."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from conftest import make_tiny_llama

from acchead import step_cost
from acchead.data_gen import bench_overhead
from acchead.distill import bench_collate
from acchead.head import AcceptanceHead
from acchead.inference.bench import head_timing, loop_profile
from acchead.inference.bench.hf_assisted import GENERATE_METHOD
from acchead.inference.bench.hf_assisted import METHOD as ASSISTED_METHOD
from acchead.inference.bench.rows import BenchRow
from acchead.inference.bench.settings import fast_family
from acchead.inference.bench.speed_report import speed_goals
from acchead.inference.bench.thresholds import GoalThresholds


def test_device_sync_waits_on_cuda_only(monkeypatch):
    waited: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waited.append(device))
    step_cost.device_sync("cpu")
    step_cost.device_sync(torch.device("cpu"))
    assert waited == []
    step_cost.device_sync("cuda:1")  # a device object is made without a GPU; the wait is the spy
    assert waited == [torch.device("cuda:1")]


@pytest.fixture
def syncs(monkeypatch):
    """Replace `device_sync` in every timer's module; returns the devices each call waited on."""
    seen: list[torch.device] = []
    for module in (step_cost, head_timing, loop_profile, bench_overhead):
        monkeypatch.setattr(module, "device_sync", lambda device: seen.append(torch.device(device)))
    return seen


def test_step_timing_waits_around_each_call(syncs):
    model = make_tiny_llama(64, hidden_size=32, num_layers=2, seed=0)
    assert len(step_cost.step_seconds(model, context=8, calls=3)) == 3
    assert syncs == [torch.device("cpu")] * 6  # before and after each of the 3 calls


def test_head_timing_waits_after_each_call(tiny_llama_pair, syncs):
    _, draft = tiny_llama_pair
    head = AcceptanceHead(32, 1, kind="lookahead", inputs=("state", "token"))
    o = head_timing.time_head_overhead(draft, head, torch.tensor([[5, 17, 42, 8]]), calls=3)
    # warm-up: 3 calls of each; then 3 timed calls of each, one wait after every call
    assert o.calls == 3 and syncs == [torch.device("cpu")] * 12


class _Runner:
    """The runner protocol's three calls `bare_feed_ms` makes, counted."""

    device = "cpu"

    def __init__(self) -> None:
        self.fed: list[int] = []

    def reset(self, capacity: int) -> None:
        pass

    def feed(self, ids: torch.Tensor, keep: int | None = None) -> None:
        self.fed.append(ids.numel())

    def rollback(self, length: int) -> None:
        pass


def test_bare_replay_timing_waits_around_each_replay(syncs):
    runner = _Runner()
    assert loop_profile.bare_feed_ms(runner, torch.arange(5), count=3, reps=4) >= 0
    assert runner.fed == [5] + [3] * 6  # the prompt, then 2 warm-up and 4 timed replays
    assert syncs == [torch.device("cpu")] * 12


def test_labelling_bench_timer_waits_on_the_models_device(syncs):
    (wall, cpu), result = bench_overhead.timed(torch.device("cpu"), lambda x, y=0: x + y, 2, y=3)
    assert result == 5 and wall >= 0 and cpu >= 0
    assert syncs == [torch.device("cpu")] * 2


def test_collate_bench_waits_on_its_device(monkeypatch):
    seen: list[str] = []
    monkeypatch.setattr(step_cost, "device_sync", seen.append)  # bench_collate imports it when it runs
    assert bench_collate.main(["--batch", "2", "--pairs", "3", "--width", "8", "--hidden", "4",
                               "--repeats", "2"]) == 0  # fmt: skip
    assert seen == ["cpu"] * 6  # host, kept, host again (the first run warms up) x two repeats


def _row(method: str, tokens_per_s: float) -> BenchRow:
    return BenchRow(
        method=method, params={}, spec=method, tokens=100, target_calls=50, draft_calls=50, discarded=0,
        wall_time=100 / tokens_per_s, verification_rate=0.5, discard_rate=0.0,
        modeled_tokens_per_s=tokens_per_s, wall_tokens_per_s=tokens_per_s, n_prompts=1,
    )  # fmt: skip


ROWS = [
    _row("autoregressive", 100.0),
    _row(fast_family("autoregressive"), 400.0),  # 2.5 ms a token
    _row(fast_family("specdec"), 500.0),  # our best K: 1.25x our AR, 2.5x assisted generation
    _row(GENERATE_METHOD, 80.0),  # our AR: 5x generate
    _row(ASSISTED_METHOD, 200.0),
]


def test_a_cuda_run_is_judged_by_the_gpu_goals():
    t = replace(GoalThresholds.shipped(), gpu_ar_ms_per_token=3.0, gpu_k_over_assisted=3.0)
    goals = speed_goals(ROWS, "cuda:0", t)
    assert [g[0].split(":")[0] for g in goals] == ["GPU"] * 3
    assert [g[1] for g in goals] == [True, False, True]  # 2.5 <= 3 ms; 2.5x < 3x; 1.25x > 1x
    assert goals[0][2] == "2.500 ms/token" and goals[2][2].startswith("1.25×")
    slower = replace(t, gpu_ar_ms_per_token=2.0, gpu_k_over_assisted=2.0)
    assert [g[1] for g in speed_goals(ROWS, "cuda", slower)] == [False, True, True]
    # without the fast path's rows the GPU's ms/token goal is not measured, not failed
    eager = [r for r in ROWS if r.method in ("autoregressive", GENERATE_METHOD, ASSISTED_METHOD)]
    assert speed_goals(eager, "cuda", t)[0][1:] == (None, "not measured (needs --paths fast)")


def test_a_cpu_run_is_judged_by_the_cpu_goals():
    t = replace(GoalThresholds.shipped(), cpu_ar_over_generate=6.0, cpu_k_over_assisted=2.0)
    goals = speed_goals(ROWS, "cpu", t)
    assert [g[0].split(":")[0] for g in goals] == ["CPU"] * 2
    assert [g[1] for g in goals] == [False, True]  # 5x < 6x; 2.5x >= 2x
    assert goals[0][2].startswith("5.00×") and goals[1][2].startswith("2.50×")
