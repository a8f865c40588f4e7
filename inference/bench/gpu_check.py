"""`acchead-gpu-check` (`make gpu-check`): what a freshly lent GPU runs first, meant to fit 10 minutes.

    acchead-gpu-check --out docs/results/gpu-check-h100.md        # on a GPU machine (cuda is the default)
    acchead-gpu-check --device cpu --no-tests --pairs toy          # the same checks on the CPU

1. Exactness, per dtype (`--exact-dtypes`, float32 and bfloat16): greedy decoding by autoregressive
   decoding, fixed K and SpecDec++ on the device's default path (CUDA: the fast path with CUDA graphs)
   against eager autoregressive greedy decoding in the same dtype, token for token, on a few prompts. A
   float32 difference fails the check; in bfloat16 a verification over L + 1 positions rounds differently
   from a one-token step, so a near-tie can flip the argmax: a difference is reported, not failed.
2. Speed: wall-clock tokens/s of autoregressive decoding, each K of `--k-grid` (the best is reported) and
   SpecDec++ with the pair's default head at each h of `--h-grid`, after `warm_up` (its seconds are
   reported: the compilation a bench pays), for the toy pair and the real pair when its assets, shipped
   draft and head are present (else one line says why not), in `--speed-dtype`.
   With `--batch-sizes`, the batched decoders at those B (`acchead.inference.bench.gpu_check_batched`).
3. Tests, last: on CUDA the GPU-marked tests (`pytest -m gpu tests/test_gpu.py`); on the CPU their twins,
   the CUDA default's branches forced onto the CPU (tests/test_device_path.py), stopped at what is left of
   the budget. Needs a checkout (tests/ beside the package); else one line says they were skipped.

Steps run in that order of value (float32 exactness, then speed, then the other dtypes' exactness, per
pair; then the tests, which compile per test: an H100 ran 3 of 7 in 125 s), under `--budget-s`: compiling
is what a fresh GPU spends its minutes on (an H200, 2026-11-26, compiled four decoders in 230 s), so a
check that would start past the budget is skipped and named in the report instead of the whole run being
killed with nothing written.

The report is markdown on stdout and, with `--out FILE`, written atomically (FILE ending in .json: the
same as JSON). Exit status 1 when a test or a float32 exactness check failed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from acchead.assets import AssetMissing
from acchead.errors import AccheadError, cli_errors, thread_count
from acchead.inference.bench.gpu_check_batched import measure_batched
from acchead.inference.bench.gpu_check_report import environment, render
from acchead.inference.bench.gpu_check_steps import (
    Budget,
    PairRun,
    check_exactness,
    measure_speed,
    profile_decode,
)
from acchead.inference.spec import parse_policy_spec

REPO = Path(__file__).resolve().parents[2]  # the checkout, when installed editable (tests/ beside it)
TEST_TIMEOUT_S = 300


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="acchead-gpu-check",
        description="GPU tests, exactness in float32 and bfloat16, and tokens/s of AR, the best fixed K and "
        "SpecDec++ on the toy pair and (when installed) the real pair: one run on a freshly lent GPU.",
    )
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="where to run (default: cuda)")
    p.add_argument("--out", help="also write the report here, atomically (.json: as JSON, else markdown)")
    p.add_argument(
        "--pairs",
        default="toy,smollm2",
        help="named pairs, comma-separated (default: toy,smollm2; "
        "a pair whose files are missing is skipped with a line)",
    )
    p.add_argument("--target", help="target model directory, overriding every listed pair's")
    p.add_argument("--draft", help="draft model directory, overriding every listed pair's")
    p.add_argument("--head", help="acceptance head for SpecDec++ (default: the pair's shipped greedy head)")
    p.add_argument("--prompts", help="prompt set or .jsonl (default: humaneval for toy, mtbench for smollm2)")
    p.add_argument("--num-prompts", type=int, default=4, help="prompts per check (default: 4; 0: every one)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens per prompt (default: 64)")
    # Each K compiles its own round unit and verifications on the fast path; the grid is kept small so that
    # the whole check fits 10 minutes on a fresh GPU (not yet timed on one: narrow it if it does not).
    p.add_argument("--k-grid", default="1,2,3", help="fixed K values timed; the best is reported (1,2,3)")
    p.add_argument(
        "--h-grid", default="0.3,0.5,0.7", help="SpecDec++ thresholds timed (default: 0.3,0.5,0.7)"
    )
    p.add_argument(
        "--exact-dtypes",
        default="float32,bfloat16",
        help="dtypes of the exactness check (default: float32,bfloat16)",
    )
    p.add_argument(
        "--speed-dtype", help="dtype of the speed check (default: bfloat16 on cuda, float32 on cpu)"
    )
    p.add_argument(
        "--path",
        default="default",
        choices=["default", "eager", "fast", "device"],
        help="the device's default (cuda: fast, cpu: eager), eager, fast, or device: the CUDA default's "
        "branches forced (on the CPU: acchead.inference.device_path)",
    )
    p.add_argument(
        "--backend",
        default="inductor",
        help="how the device path compiles its units: inductor (default; fused kernels, CUDA graphs) or "
        "cudagraphs (the traced kernels captured as CUDA graphs, no Inductor: a shorter warm-up)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="interleaved timing rounds of every method; the median is reported (default: 3)",
    )
    p.add_argument(
        "--speed-first",
        action="store_true",
        help="time the methods before the float32 exactness check (default: exactness first)",
    )
    p.add_argument(
        "--batch-sizes",
        default="",
        help="after the speed check, batched decoding at these B, comma-separated (e.g. 4,16): batched AR, "
        "the best K, the best SpecDec++ under the measured batch rule and copy rounds beside the best K "
        "(default: none)",
    )
    p.add_argument("--no-tests", action="store_true", help="skip step 3 (the test run)")
    p.add_argument(
        "--budget-s",
        type=float,
        default=480.0,
        help="seconds after which no new check starts; the ones left are named as skipped (default 480: "
        "a 10-minute call with room for the install)",
    )
    p.add_argument("--threads", type=thread_count, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument(
        "--profile",
        metavar="SPEC",
        help="after the speed check, profile one greedy decode of the first prompt by SPEC (e.g. "
        "autoregressive) with torch.profiler: ms a token on the host and the device, syncs, graph and "
        "kernel launches, the top operators (default: none)",
    )
    return p


def _floats(text: str, flag: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise AccheadError(f"{flag} must be comma-separated numbers, got {text!r}") from None


def run_tests(device: str, timeout: float = TEST_TIMEOUT_S) -> dict[str, Any]:
    """The GPU-marked tests on CUDA, their CPU twins on the CPU: pytest in a subprocess, from the checkout,
    stopped after `timeout` seconds."""
    tests = REPO / "tests"
    if not (tests / "test_gpu.py").is_file():
        return {"ran": False, "line": f"tests skipped: no checkout's tests/ at {tests}"}
    if device == "cuda":
        cmd = ["-m", "gpu", "tests/test_gpu.py"]
    else:
        cmd = ["-m", "not slow and not gpu", "tests/test_device_path.py"]
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", *cmd]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"ran": True, "ok": False, "line": f"{' '.join(cmd[3:])}: timed out after {timeout:.0f} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    summary = lines[-1] if lines else proc.stderr.strip()[-200:]
    return {
        "ran": True,
        "ok": proc.returncode == 0,
        "command": " ".join(cmd[1:]),
        "summary": summary,
        "seconds": round(time.perf_counter() - start, 1),
    }


def _check_before_decoding(args: argparse.Namespace, specs: list[str], dtypes: list[str]) -> None:
    """What the checks would refuse only after minutes of decoding (on a GPU, after compiling): the grids'
    policy specs, the dtypes, the pairs' names, the prompt count, the head file and --out's place."""
    from acchead.models import parse_dtype
    from acchead.pairs import PAIR_NAMES

    for spec in specs:
        parse_policy_spec(spec)
    for dtype in dtypes:
        parse_dtype(dtype)
    unknown = [n.strip() for n in args.pairs.split(",") if n.strip() and n.strip() not in PAIR_NAMES]
    if unknown:
        raise AccheadError(f"--pairs: unknown pair {unknown[0]!r}; choose from {', '.join(PAIR_NAMES)}")
    if args.num_prompts < 0 or args.max_new_tokens < 1:
        raise AccheadError("--num-prompts must be >= 0 (0: every prompt) and --max-new-tokens >= 1")
    if args.head and not Path(args.head).expanduser().is_file():
        raise AccheadError(f"--head {args.head}: no such file")
    out = Path(args.out).expanduser() if args.out else None
    if out is not None and (out.is_dir() or any(p.exists() and not p.is_dir() for p in out.parents)):
        raise AccheadError(f"--out {args.out}: give a file path whose folders are folders")


def on_device_path(path: str, device: str) -> bool:
    """Whether `--path` on `device` decodes on the device path, which `--backend` compiles: `device`
    anywhere, and on CUDA the default and `fast` (the fast path is the device path there; `fast` also
    compiles a feature draft, which the default leaves eager)."""
    return path == "device" or (path in ("default", "fast") and device == "cuda")


def run_check(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise AccheadError("--device cuda: no CUDA device here (use --device cpu for the CPU run)")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    k_values = _floats(args.k_grid, "--k-grid")
    if any(k != int(k) for k in k_values):
        raise AccheadError(f"--k-grid takes whole numbers, got {args.k_grid}")
    ks = [int(k) for k in k_values]
    hs = _floats(args.h_grid, "--h-grid")
    sizes = [int(b) for b in _floats(args.batch_sizes, "--batch-sizes")]
    if any(b < 1 for b in sizes):
        raise AccheadError(f"--batch-sizes must be >= 1, got {args.batch_sizes}")
    if not ks or not hs:
        raise AccheadError("--k-grid and --h-grid need at least one value each")
    from acchead.inference.device_path import DevicePath

    try:
        backend_path = None if args.backend == "inductor" else DevicePath(True, backend=args.backend)
    except ValueError as e:
        raise AccheadError(f"--backend: {e}") from None
    if backend_path is not None and not on_device_path(args.path, args.device):
        raise AccheadError(f"--backend {args.backend} compiles the device path: use --path device (or cuda)")
    if args.profile:
        parse_policy_spec(args.profile)  # a malformed SPEC is one line now, not after the speed check
    if args.repeats < 1:
        raise AccheadError(f"--repeats must be >= 1 (got {args.repeats})")
    if args.budget_s < 0:
        raise AccheadError(f"--budget-s must be >= 0 (got {args.budget_s:g})")
    speed_dtype = args.speed_dtype or ("bfloat16" if args.device == "cuda" else "float32")
    exact_dtypes = [d.strip() for d in args.exact_dtypes.split(",") if d.strip()]
    fixed = [f"specdec:k={k}" for k in ks]
    adaptive = [f"specdecpp:h={h:g},max={max(ks) * 2}" for h in hs]
    _check_before_decoding(args, [*fixed, *adaptive], [speed_dtype, *exact_dtypes])
    report: dict[str, Any] = {
        "environment": environment(args.device, REPO),
        "budget_s": args.budget_s,
        "path": args.path,
        "num_prompts": args.num_prompts,
        "repeats": args.repeats,
        "backend": args.backend,
        "max_new_tokens": args.max_new_tokens,
        "pairs": {},
    }
    budget = Budget(args.budget_s)
    ok = True
    for name in [n.strip() for n in args.pairs.split(",") if n.strip()]:
        try:
            run = PairRun(args, name, backend_path)
        except AssetMissing as e:  # only a pair whose files are not installed is skipped; a bad flag fails
            report["pairs"][name] = {"skipped": str(e)}
            continue
        checked = ["autoregressive", fixed[len(fixed) // 2], adaptive[0]]
        # float32 exactness first (a difference fails the check), then speed, then the other dtypes;
        # --speed-first puts speed first (float32 exactness already ran on this device, say)
        exact: dict[str, Any] = {}
        if "float32" in exact_dtypes and not args.speed_first:
            exact["float32"] = check_exactness(run, "float32", checked, budget)
        warmed: dict = {}
        copied = f"copy+{fixed[len(fixed) // 2]}"  # copy rounds beside the middle K (docs/how-it-works.md)
        speed = measure_speed(run, speed_dtype, ["autoregressive", *fixed, *adaptive, copied], budget, warmed)
        profiled = profile_decode(run, speed_dtype, args.profile, budget, warmed) if args.profile else None
        warmed.clear()
        if "float32" in exact_dtypes and args.speed_first:
            exact["float32"] = check_exactness(run, "float32", checked, budget)
        for d in exact_dtypes:
            if d != "float32":
                exact[d] = check_exactness(run, d, checked, budget)
        ok = ok and all(c.get("equal", True) for c in exact.get("float32", {}).values())
        # a decoder that failed to compile or replay, in any check, fails the run
        ok = ok and not speed["failed"] and not any("failed" in c for d in exact.values() for c in d.values())
        report["pairs"][name] = {"exactness": exact, "speed_dtype": speed_dtype, "speed": speed}
        if sizes:  # the speed check's best K and SpecDec++ (its first settings when it timed none)
            best_k = speed.get("best_fixed", fixed[len(fixed) // 2])
            specs = ["autoregressive", best_k, speed.get("best_specdecpp", adaptive[0]), f"copy+{best_k}",
                     f"copy:batch=64+{best_k}"]  # a round's copy budget: 16 positions (the default), 64
            batched = measure_batched(run, speed_dtype, specs, sizes, budget)
            report["pairs"][name]["batched"] = batched
            differs = speed_dtype == "float32" and any(
                r["equal_to_ar"] is False for at in batched["sizes"].values() for r in at["rows"].values())
            ok = ok and not differs and not batched["failed"]
        if profiled is not None:
            report["pairs"][name]["profile"] = profiled
            ok = ok and "failed" not in profiled
    if args.no_tests:
        report["tests"] = {"ran": False}
    elif budget.over():
        report["tests"] = {"ran": False, "line": f"tests skipped (past the {args.budget_s:g} s budget)"}
    else:
        report["tests"] = run_tests(args.device, min(TEST_TIMEOUT_S, budget.remaining()))
    report["ok"] = bool(ok and report["tests"].get("ok", True))
    return report


@cli_errors
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    report = run_check(args)
    text = render(report)
    print(text, end="")
    if args.out:
        from acchead.rundir import atomic_write_json, atomic_write_text

        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.suffix == ".json":
            atomic_write_json(out, report)
        else:
            atomic_write_text(out, text)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
