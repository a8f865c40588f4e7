"""The report of `acchead-gpu-check` (`acchead.inference.bench.gpu_check`): the machine it ran on and the
markdown it prints, from the report dict the checks fill."""

from __future__ import annotations

import datetime
import platform
import subprocess
from pathlib import Path
from typing import Any

from acchead.inference.bench.gpu_check_batched import batched_lines


def environment(device: str, repo: Path) -> dict[str, Any]:
    import torch
    import transformers

    if device == "cuda":
        name = torch.cuda.get_device_name()
    else:
        name = f"CPU ({platform.processor() or platform.machine()}), {torch.get_num_threads()} torch threads"
    try:
        commit = (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10
            ).stdout.strip()
            or "unknown"
        )
    except OSError:
        commit = "unknown"
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit,
        "device": name,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def render(report: dict[str, Any]) -> str:
    """The report as markdown."""
    env = report["environment"]
    lines = [
        f"# acchead-gpu-check, {env['date']}",
        "",
        f"commit {env['commit']}; {env['device']}; torch {env['torch']}, transformers "
        f"{env['transformers']}; path {report['path']} ({report.get('backend', 'inductor')}); "
        f"{report['num_prompts']} prompts x "
        f"{report['max_new_tokens']} new tokens, greedy",
        "",
    ]
    tests = report["tests"]
    if not tests.get("ran"):
        lines += [f"- {tests.get('line', 'tests not run (--no-tests)')}"]
    elif "summary" in tests:
        verdict = "passed" if tests["ok"] else "FAILED"
        lines += [f"- tests {verdict} ({tests['seconds']} s): `{tests['command']}`: {tests['summary']}"]
    else:
        lines += [f"- tests FAILED: {tests['line']}"]
    for name, pair in report["pairs"].items():
        lines += ["", f"## {name}", ""]
        if "skipped" in pair:
            lines += [f"skipped: {pair['skipped']}"]
            continue
        for dtype, checks in pair["exactness"].items():
            for spec, c in checks.items():
                if c.get("skipped"):
                    lines.append(
                        f"- exactness {dtype}, `{spec}`: skipped (past the {report['budget_s']:g} s budget)"
                    )
                    continue
                if "failed" in c:
                    lines.append(f"- exactness {dtype}, `{spec}`: FAILED to run: {c['failed']}")
                    continue
                said = (
                    "equal to eager AR" if c["equal"] else "DIFFERS from eager AR: " + ", ".join(c["differs"])
                )
                where = "eager" if not c["fast"] else "fast, device path" if c["device_path"] else "fast"
                lines.append(f"- exactness {dtype}, `{spec}` ({where}): {said}")
        sp = pair["speed"]
        lines += [
            "",
            f"Speed in {pair['speed_dtype']} (warm-up {sp['warm_up_s']} s in all):",
            "",
            f"| method | warm-up (s) | tokens a repeat | tokens/s (median of {report['repeats']}) | range |",
            "|---|---|---|---|---|",
        ]
        for spec, r in sp["rows"].items():
            lo, hi = r["tokens_per_s_range"]
            rate = f"{r['tokens_per_s']:.1f} | {lo:.1f}-{hi:.1f}"
            lines.append(f"| `{spec}` | {r['warm_up_s']} | {r['tokens']} | {rate} |")
        for spec in sp["skipped"]:
            lines.append(f"| `{spec}` | skipped (past the {report['budget_s']:g} s budget) | | | |")
        for spec, line in sp.get("failed", {}).items():
            lines.append(f"| `{spec}` | FAILED: {line} | | | |")
        lines.append("")
        if "best_fixed" in sp:
            lines.append(
                f"best fixed K `{sp['best_fixed']}`: {sp['best_k_over_ar']:.3f}x AR; best SpecDec++ "
                f"`{sp['best_specdecpp']}`: {sp['specdecpp_over_ar']:.3f}x AR, "
                f"{sp['specdecpp_over_best_k']:.3f}x the best fixed K"
                + (f"; copy rounds `{sp['best_copy']}`: {sp['copy_over_ar']:.3f}x AR, "
                   f"{sp['copy_over_best_k']:.3f}x the best fixed K" if "best_copy" in sp else "")
            )
        else:
            lines.append("no ratios: AR, a fixed K and a SpecDec++ setting were not all timed")
        if "batched" in pair:
            lines += batched_lines(pair["batched"], report["repeats"], report["budget_s"])
        if "profile" in pair:
            lines += _profile_lines(pair["profile"], report["budget_s"])
    lines += ["", f"verdict: {'ok' if report['ok'] else 'FAILED'}"]
    return "\n".join(lines) + "\n"


def _profile_lines(prof: dict[str, Any], budget_s: float) -> list[str]:
    """`--profile`'s section: one decode's ms a token, its syncs and launches, the top operators."""
    head = f"Profile of `{prof['spec']}`, one greedy decode of the first prompt"
    if prof.get("skipped"):
        return ["", f"{head}: skipped (past the {budget_s:g} s budget)"]
    if "failed" in prof:
        return ["", f"{head}: FAILED: {prof['failed']}"]
    c = prof["calls"]
    return [
        "",
        f"{head} ({prof['tokens']} tokens): {prof['wall_ms_per_token']:.3f} ms a token on the wall clock, "
        f"{prof['device_ms_per_token']:.3f} ms of device kernels; {c['Synchronize']} stream syncs, "
        f"{c['GraphLaunch']} CUDA-graph launches, {c['LaunchKernel']} kernel launches",
        "",
        "```",
        prof["table"].rstrip(),
        "```",
    ]
