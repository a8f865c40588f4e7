"""`acchead-gpu-check --device cpu` (`make gpu-check`'s CPU run) on the tiny pair: exactness per dtype,
tokens/s of AR, the best fixed K and SpecDec++, the report written atomically; a pair without its files is
skipped with a line."""

from __future__ import annotations

import json
import re

import pytest
import torch

from acchead.head import AcceptanceHead
from acchead.head_io import HeadMetadata, save_head
from acchead.inference.bench.gpu_check import main, on_device_path
from acchead.models import load_causal_lm, model_identity
from acchead.sampling import SamplingConfig


@pytest.fixture
def check_argv(tiny_pair_dirs, tmp_path) -> list[str]:
    draft = load_causal_lm(tiny_pair_dirs[1])
    torch.manual_seed(0)
    head = AcceptanceHead(draft.config.hidden_size, 1)
    meta = HeadMetadata(depth=1, hidden_size=head.hidden_size, w_acc=1.0, w_rej=6.0,
                        draft=model_identity(draft), sampling=SamplingConfig(0.0).to_dict())  # fmt: skip
    head_path = save_head(head, tmp_path / "head.safetensors", meta=meta)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("def add(a, b):\n", "for i in ")))
    return ["--device", "cpu", "--no-tests", "--pairs", "toy", "--target", str(tiny_pair_dirs[0]),
            "--draft", str(tiny_pair_dirs[1]), "--head", str(head_path), "--prompts", str(prompts),
            "--num-prompts", "2", "--max-new-tokens", "12", "--k-grid", "1,2",
            "--h-grid", "0.4,0.6"]  # fmt: skip


def test_cpu_run_checks_exactness_and_times_every_method(check_argv, tmp_path, capsys):
    out = tmp_path / "report" / "gpu-check.md"
    assert main([*check_argv, "--out", str(out)]) == 0
    text = out.read_text()
    assert text == capsys.readouterr().out
    for dtype in ("float32", "bfloat16"):
        for spec in ("autoregressive", "specdec:k=2", "specdecpp:h=0.4,max=4"):
            assert f"exactness {dtype}, `{spec}` (eager): " in text
    assert "exactness float32, `specdec:k=2` (eager): equal to eager AR" in text
    for spec in (
        "autoregressive",
        "specdec:k=1",
        "specdec:k=2",
        "specdecpp:h=0.4,max=4",
        "specdecpp:h=0.6,max=4",
        "copy+specdec:k=2",  # copy rounds beside the middle K
    ):
        assert f"| `{spec}` | " in text
    assert "x the best fixed K" in text and "verdict: ok" in text and "tests not run" in text
    assert "copy rounds `copy+specdec:k=2`: " in text


def test_profile_times_one_decode_and_lists_its_operators(check_argv, tmp_path):
    """`--profile SPEC`: one decode of the first prompt under torch.profiler, with the decoder the speed
    check warmed: its ms a token, its launches and syncs, the top operators, in the JSON and the markdown."""
    out = tmp_path / "gpu-check.json"
    argv = [*check_argv, "--exact-dtypes", "", "--k-grid", "1", "--h-grid", "0.5", "--repeats", "1",
            "--profile", "specdec:k=1", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    prof = json.loads(out.read_text())["pairs"]["toy"]["profile"]
    assert prof["spec"] == "specdec:k=1" and prof["tokens"] == 12
    assert prof["wall_ms_per_token"] > 0 and prof["device_ms_per_token"] == 0  # no device on the CPU
    assert set(prof["calls"]) == {"Synchronize", "GraphLaunch", "LaunchKernel"}
    assert "Self CPU" in prof["table"] and "aten::" in prof["table"]
    md = tmp_path / "gpu-check.md"
    assert main([*argv[:-1], str(md)]) == 0
    assert "Profile of `specdec:k=1`, one greedy decode of the first prompt (12 tokens): " in md.read_text()


def test_a_malformed_profile_spec_is_one_line_before_any_check(check_argv, capsys, monkeypatch):
    from acchead.inference.bench import gpu_check

    monkeypatch.setattr(gpu_check, "PairRun", None)  # nothing may load or time before the refusal
    assert main([*check_argv, "--profile", "specdec:k=x"]) == 2
    err = capsys.readouterr().err
    assert "cannot parse policy" in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--pairs", "smolm2"], "unknown pair 'smolm2'"),  # a typo: skipped, exit 0 and "ok" before
        (["--num-prompts", "-1"], "--num-prompts must be >= 0"),  # the same
        (["--target", "/nonexistent"], "does not exist"),  # the same: only missing assets are skipped
        (["--k-grid", "1.5"], "--k-grid takes whole numbers"),  # read as 1 before
        (["--h-grid", "2"], "0 < h < 1"),  # refused after float32 exactness before
        (["--exact-dtypes", "float32,foo"], "unknown dtype 'foo'"),  # after exactness and speed before
        (["--speed-dtype", "foo"], "unknown dtype 'foo'"),
        (["--head", "/nonexistent.safetensors"], "no such file"),
        (["--out", "/dev/null/x.md"], "give a file path"),  # checked after the whole run before
    ],
)
def test_bad_flags_are_one_line_before_any_model_loads(check_argv, capsys, monkeypatch, flags, message):
    from acchead.inference.bench import gpu_check

    if flags[0] != "--target":
        monkeypatch.setattr(gpu_check, "PairRun", None)  # nothing may load or time before the refusal
    assert main([*check_argv, *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err, err


def test_json_report_and_a_pair_without_files_is_skipped(check_argv, tmp_path):
    out = tmp_path / "gpu-check.json"
    # the test session's cache (ACCHEAD_CACHE_DIR) holds no real-pair assets
    assert main(["--device", "cpu", "--no-tests", "--pairs", "smollm2", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert "skipped" in report["pairs"]["smollm2"] and report["ok"] is True
    assert not (tmp_path / "gpu-check.json.tmp").exists()


def test_cuda_without_a_gpu_is_one_line(capsys):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert main(["--device", "cuda", "--no-tests"]) == 2
    assert "no CUDA device here" in capsys.readouterr().err


def test_checks_past_the_budget_are_named_not_run(check_argv, tmp_path):
    """A check that would start past --budget-s is skipped and named (a killed run writes nothing)."""
    out = tmp_path / "gpu-check.json"
    assert main([*check_argv, "--budget-s", "0", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    pair = report["pairs"]["toy"]
    assert all(c == {"skipped": True} for d in pair["exactness"].values() for c in d.values())
    assert pair["speed"]["rows"] == {} and len(pair["speed"]["skipped"]) == 1 + 2 + 2 + 1  # and a copy
    md = tmp_path / "gpu-check.md"
    assert main([*check_argv, "--budget-s", "0", "--out", str(md)]) == 0
    # the tests run last, with what is left of the budget: none here
    no_flag = [a for a in check_argv if a != "--no-tests"]
    assert main([*no_flag, "--budget-s", "0", "--out", str(md)]) == 0
    assert "tests skipped (past the 0 s budget)" in md.read_text()
    text = md.read_text()
    assert "skipped (past the 0 s budget)" in text and "no ratios" in text


def test_a_negative_budget_is_one_line(capsys):
    assert main(["--device", "cpu", "--no-tests", "--budget-s", "-1"]) == 2
    err = capsys.readouterr().err
    assert "--budget-s must be >= 0" in err and err.count("\n") == 1


def test_backend_flag_reaches_the_device_path_and_is_refused_off_it(check_argv, tmp_path, capsys):
    """`--backend cudagraphs` compiles the device path's units with torch's cudagraphs backend (uncaptured
    on the CPU); off the device path, or an unknown backend, is one line."""
    out = tmp_path / "gpu-check.json"
    argv = [*check_argv, "--path", "device", "--backend", "cudagraphs", "--exact-dtypes", "float32",
            "--k-grid", "1", "--h-grid", "0.5", "--repeats", "1", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert report["backend"] == "cudagraphs" and report["ok"]
    checks = report["pairs"]["toy"]["exactness"]["float32"].values()
    assert all(c["device_path"] and c["equal"] for c in checks)
    capsys.readouterr()
    assert main([*check_argv, "--backend", "cudagraphs"]) == 2
    assert "use --path device" in capsys.readouterr().err
    assert main([*check_argv, "--path", "device", "--backend", "tvm"]) == 2
    assert "unknown compile backend" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("path", "device", "on"),
    [("device", "cpu", True), ("default", "cpu", False), ("fast", "cpu", False), ("eager", "cuda", False),
     ("default", "cuda", True), ("fast", "cuda", True), ("device", "cuda", True)],
)  # fmt: skip
def test_backend_is_taken_where_the_path_is_the_device_path(path, device, on):
    """`--backend` compiles the device path: on CUDA the fast path is it, so `--path fast` (which compiles a
    feature draft too, an H200's real-pair check of 2026-11-28) takes a backend there, never on the CPU."""
    assert on_device_path(path, device) is on


def test_a_decoder_that_fails_to_compile_is_a_line_and_the_rest_run(check_argv, tmp_path, monkeypatch):
    """A compile or replay error of one decoder (an H200's Inductor failed so on the real pair, ending the
    whole run with a traceback) is a line in the report and fails the verdict; the others are still
    checked and timed."""
    from acchead.inference.decoder import SpeculativeDecoder
    from acchead.inference.specdecpp_policy import SpecDecPP

    warm_up = SpeculativeDecoder.warm_up

    def failing(self, *args, **kwargs):
        if isinstance(self.policy, SpecDecPP):
            raise RuntimeError("InductorError: AssertionError: \n(the rest of the message)")
        return warm_up(self, *args, **kwargs)

    monkeypatch.setattr(SpeculativeDecoder, "warm_up", failing)
    out = tmp_path / "gpu-check.json"
    assert main([*check_argv, "--exact-dtypes", "float32", "--out", str(out)]) == 1
    report = json.loads(out.read_text())
    pair = report["pairs"]["toy"]
    line = "RuntimeError: InductorError: AssertionError: "
    assert pair["speed"]["failed"] == {"specdecpp:h=0.4,max=4": line, "specdecpp:h=0.6,max=4": line}
    assert set(pair["speed"]["rows"]) == {"autoregressive", "specdec:k=1", "specdec:k=2", "copy+specdec:k=2"}
    assert pair["exactness"]["float32"]["specdecpp:h=0.4,max=4"] == {"failed": line}
    assert pair["exactness"]["float32"]["specdec:k=2"]["equal"] and report["ok"] is False
    md = tmp_path / "gpu-check.md"
    assert main([*check_argv, "--exact-dtypes", "float32", "--out", str(md)]) == 1
    text = md.read_text()
    assert f"| `specdecpp:h=0.6,max=4` | FAILED: {line} |" in text and "verdict: FAILED" in text
    assert f"exactness float32, `specdecpp:h=0.4,max=4`: FAILED to run: {line}" in text


def test_batch_sizes_time_the_batched_decoders_and_compare_rows(check_argv, tmp_path):
    """`--batch-sizes 1,3`: batched AR, the speed check's best K and SpecDec++ (the measured batch rule) and
    copy rounds beside the best K at each B, every greedy row equal to batched AR's (float32 on the CPU: a
    difference would fail the run), their ratios in the JSON and the markdown."""
    out = tmp_path / "gpu-check.json"
    assert main([*check_argv, "--exact-dtypes", "float32", "--repeats", "1", "--batch-sizes", "1,3",
                 "--out", str(out)]) == 0  # fmt: skip
    report = json.loads(out.read_text())
    pair = report["pairs"]["toy"]
    best_k, best_pp = pair["speed"]["best_fixed"], pair["speed"]["best_specdecpp"]
    for size in ("1", "3"):
        at = pair["batched"]["sizes"][size]
        copies = {f"copy+{best_k}", f"copy:batch=64+{best_k}"}
        assert set(at["rows"]) == {"autoregressive", best_k, best_pp, *copies}  # keys sorted in JSON
        assert all(r["equal_to_ar"] and r["tokens_per_s"] > 0 for r in at["rows"].values())
        assert at["specdecpp_over_better"] > 0 and at["copy_over_best_k"] > 0 and at["best_copy"] in copies
    # A second run times again, so its best K may differ from the first run's: any fixed K may stand there.
    text = main_markdown(check_argv, tmp_path)
    assert re.search(r"\| 3 \| `copy:batch=64\+specdec:k=\d+` \| ", text) and "- B = 3: SpecDec++ " in text
    assert main([*check_argv, "--batch-sizes", "0"]) == 2  # a bad size: one line


def main_markdown(check_argv: list[str], tmp_path) -> str:
    out = tmp_path / "gpu-check.md"
    assert main([*check_argv, "--exact-dtypes", "float32", "--repeats", "1", "--batch-sizes", "3",
                 "--out", str(out)]) == 0  # fmt: skip
    return out.read_text()


@pytest.mark.parametrize(
    ("path", "device", "fast", "device_path"),
    [("default", "cpu", False, False), ("eager", "cuda", False, False), ("default", "cuda", True, None),
     ("fast", "cpu", True, False), ("device", "cpu", True, True)],
)  # fmt: skip
def test_batched_decoders_take_the_runs_path(tiny_pair_dirs, path, device, fast, device_path):
    """The batched check decodes on the batched fast path where `--path` means the fast path (CUDA's
    default, fast, device), compiled as the device path where asked; SpecDec++ under the measured rule."""
    from types import SimpleNamespace

    from acchead.inference.bench.gpu_check_batched import batched_decoder

    models = (load_causal_lm(tiny_pair_dirs[0]), load_causal_lm(tiny_pair_dirs[1]))
    draft = models[1]
    run = SimpleNamespace(models=lambda dtype: models, backend_path=None,
                          args=SimpleNamespace(path=path, device=device),
                          head=AcceptanceHead(draft.config.hidden_size, 1))  # fmt: skip
    dec = batched_decoder(run, "float32", "copy+specdecpp:h=0.5,max=4")
    assert dec.fast is fast and dec.copy is not None and dec.batch_stop.measure
    if fast:  # on the CPU the device path is what --path device forces; CUDA's own resolves it (None)
        assert dec.t_cache.path.on is (device_path is True)
    assert batched_decoder(run, "float32", "autoregressive").draft is None


@pytest.mark.slow
def test_batched_check_compiles_on_the_device_path(check_argv, tmp_path):
    """`--path device --backend cudagraphs --batch-sizes 2` (~20 s more): the batched decoders compiled as on
    CUDA (uncaptured on the CPU), every row equal to batched AR's."""
    out = tmp_path / "gpu-check.json"
    argv = [*check_argv, "--path", "device", "--backend", "cudagraphs", "--exact-dtypes", "float32",
            "--k-grid", "1", "--h-grid", "0.5", "--repeats", "1", "--batch-sizes", "2",
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    batched = json.loads(out.read_text())["pairs"]["toy"]["batched"]["sizes"]["2"]["rows"].values()
    assert all(r["warm_up_s"] > 0 and r["equal_to_ar"] for r in batched)


def test_the_test_step_runs_pytest_from_the_checkout_and_reports_it(check_argv, tmp_path, monkeypatch):
    """Step 3 (`run_tests`): pytest in a subprocess from the checkout (on the CPU the device path's twins),
    its last line as the summary and its verdict in the report's; a checkout without tests/ and a run past
    its time are each one line."""
    from acchead.inference.bench import gpu_check

    repo = tmp_path / "checkout"
    monkeypatch.setattr(gpu_check, "REPO", repo)
    assert gpu_check.run_tests("cpu")["line"].startswith("tests skipped: no checkout's tests/")
    (repo / "tests").mkdir(parents=True)
    (repo / "tests" / "test_gpu.py").write_text("")
    (repo / "tests" / "test_device_path.py").write_text("def test_a():\n    pass\n\n\n"
                                                        "def test_b():\n    assert False\n")  # fmt: skip
    late = gpu_check.run_tests("cpu", timeout=0.01)
    assert late == {"ran": True, "ok": False, "line": late["line"]} and "timed out after 0 s" in late["line"]
    md = tmp_path / "gpu-check.md"
    with_tests = [a for a in check_argv if a != "--no-tests"]
    assert main([*with_tests, "--out", str(md)]) == 1  # the checks pass, the tests do not
    text = md.read_text()
    assert re.search(r"- tests FAILED \([\d.]+ s\): `-m pytest .*-m not slow and not gpu "
                     r"tests/test_device_path.py`: 1 failed, 1 passed", text), text  # fmt: skip
