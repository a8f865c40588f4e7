"""What a bench run is, and the per-prompt results it saved so far (`OUT/partial/prompt-NNNN.json`).

`run_key` is everything one prompt's runs depend on (models, heads, prompts, S, seed, lengths, device,
dtype); its hash, the fingerprint, is stored in every partial file, so a re-run with the same settings
resumes and one with other settings recomputes. `run_identity` adds what shapes the whole run (the grid,
threads, truncation): another identity in an existing OUT is refused (`acchead.rundir`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from acchead.rundir import atomic_write_json

if TYPE_CHECKING:
    import torch

    from acchead.inference.bench.costmodel import RunCounts
    from acchead.inference.bench.settings import Setting


@dataclass
class PromptRun:
    """One prompt under one setting: the counts plus a digest of the output (for the greedy check)."""

    prompt: int
    tokens: int
    target_calls: int
    draft_calls: int
    discarded: int
    wall_time: float
    output_sha: str

    def counts(self) -> RunCounts:
        from acchead.inference.bench.costmodel import RunCounts

        return RunCounts(self.tokens, self.target_calls, self.draft_calls, self.discarded, self.wall_time)


def output_digest(ids: torch.Tensor) -> str:
    """A short digest of generated ids (any shape): equal outputs, equal digests."""
    import torch

    return hashlib.sha1(ids.to(torch.int64).cpu().numpy().tobytes()).hexdigest()[:16]


def run_fingerprint(
    args: argparse.Namespace, prompt_ids: list[torch.Tensor], target, draft, head_paths: list[Path]
) -> str:
    """Hash of everything a partial result depends on; partials with another hash are recomputed."""
    key = run_key(args, prompt_ids, target, draft, head_paths)
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def run_key(
    args: argparse.Namespace, prompt_ids: list[torch.Tensor], target, draft, head_paths: list[Path]
) -> dict:
    """Everything one prompt's runs depend on (models, heads, prompts, S, seed, lengths, device, dtype).

    `head` is the sha256 of every head file the settings decode with, in `--head` order (None without
    heads), so partial results of another head set are not reused.
    """
    from acchead.models import model_identity

    h = hashlib.sha256()
    for ids in prompt_ids:
        h.update(ids.cpu().numpy().tobytes())
    head_sha = [hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in head_paths] or None
    key = {
        "max_new_tokens": args.max_new_tokens,
        "sampling": [args.temperature, args.top_k, args.top_p],
        "seed": args.seed,
        "target": model_identity(target)["fingerprint"],
        "draft": model_identity(draft)["fingerprint"],
        "head": head_sha,
        "device": args.device,
        "dtype": args.dtype,
        "prompts": h.hexdigest(),
    }
    return key


def run_identity(args: argparse.Namespace, key: dict, settings: list[Setting]) -> dict:
    """The bench run an output directory holds: `run_key` plus the grid and what shapes the timings.

    Another grid, thread count or truncation setting is another run (its results.json would differ), so
    it is refused in an existing OUT instead of silently replacing the results there.
    """
    return {
        **key,
        "settings": [s.key for s in settings],
        "threads": args.threads,
        "overhead_calls": args.overhead_calls,
        "truncate_prompts": args.truncate_prompts,
        **({"batch_size": args.batch_size} if args.batch_size else {}),  # absent: the identity of older runs
    }


def load_partial(path: Path, fingerprint: str) -> dict[str, PromptRun]:
    """Runs of one prompt saved by an earlier bench with the same fingerprint, by setting key."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if data.get("fingerprint") != fingerprint:
        return {}
    return {key: PromptRun(**r) for key, r in data.get("runs", {}).items()}


def save_partial(path: Path, fingerprint: str, runs: dict[str, PromptRun]) -> None:
    """Write one prompt's runs, by setting key (atomic, fsynced: a partial survives a power loss)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"fingerprint": fingerprint, "runs": {k: asdict(r) for k, r in runs.items()}}
    atomic_write_json(path, data, indent=1, sort_keys=False)


def partial_path(out: Path, i: int) -> Path:
    return out / "partial" / f"prompt-{i:04d}.json"
