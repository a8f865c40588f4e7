"""Where a decode's time goes, per path: a draft step and a verification inside the decoder beside a bare
replay of the same forward, and the host reads per round.

    profile = profile_loop(decoder, prompts, max_new_tokens=64, sampling=SamplingConfig())

A draft step inside the decoder is a round's drafting time over its draft forwards (the forward plus S's
processing, the sample, the stop rule and the bookkeeping around them); a verification is the round's
target forward with everything after it (p, τ, the next token, the status read, both rollbacks), over
every round but a decode's first (which also feeds the prompt). A bare
replay runs the same runner's forward alone, on a cache of the prompt's length, with nothing around it.
Their ratio is the decoder's overhead on that path (the device-resident loop's goal on an H100: at most
1.2 for both). Timings use CUDA events on a GPU and `perf_counter` on the CPU (`SpeculativeDecoder.generate
(profile=True)`); the host reads come from `acchead.inference.host_reads`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from acchead.inference.decoder import SpeculativeDecoder
from acchead.inference.drafters import ModelDrafter
from acchead.sampling import SamplingConfig
from acchead.step_cost import device_sync


@torch.inference_mode()  # as the decoder runs (a static cache's write counters are inference tensors)
def bare_feed_ms(runner: Any, prompt: torch.Tensor, count: int, reps: int = 20) -> float:
    """Median ms of `runner.feed(count tokens)` after `prompt` ((T,) int64), rolled back between reps."""
    device = torch.device(getattr(runner, "device", "cpu"))
    runner.reset(prompt.numel() + count + 1)
    runner.feed(prompt.to(device))
    ids = prompt[-1:].repeat(count).to(device)
    times = []
    for _ in range(reps + 2):  # the first two warm caches and allocators
        device_sync(device)
        t0 = time.perf_counter()
        runner.feed(ids, keep=count)
        device_sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
        runner.rollback(prompt.numel())
    return statistics.median(times[2:])


@dataclass(frozen=True)
class LoopProfile:
    """One decoder's loop profile (medians in ms; `*_vs_bare`: inside the decoder over the bare replay).

    Attributes:
        policy, path: what was profiled ("specdec:k=3", "eager" / "fast").
        rounds: rounds over all prompts. host_reads_per_round: device-to-host reads per round.
        verify_ms, draft_step_ms: a verification / a draft step inside the decoder (None: none ran).
        verify_tokens: the verification length the decoder used most (ties: the longest), replayed bare.
        bare_target_ms, bare_draft_ms: the bare replays (draft: None for a drafter that is no model).
    """

    policy: str
    path: str
    rounds: int
    host_reads_per_round: float
    verify_ms: float | None
    draft_step_ms: float | None
    verify_tokens: int
    bare_target_ms: float
    bare_draft_ms: float | None = None

    @property
    def verify_vs_bare(self) -> float | None:
        return None if self.verify_ms is None else self.verify_ms / self.bare_target_ms

    @property
    def draft_step_vs_bare(self) -> float | None:
        if self.draft_step_ms is None or self.bare_draft_ms is None:
            return None
        return self.draft_step_ms / self.bare_draft_ms

    def to_dict(self) -> dict[str, Any]:
        """The results.json form: the fields and both ratios."""
        ratios = {"verify_vs_bare": self.verify_vs_bare, "draft_step_vs_bare": self.draft_step_vs_bare}
        return asdict(self) | ratios


def profile_loop(
    decoder: SpeculativeDecoder,
    prompts: Sequence[torch.Tensor],
    max_new_tokens: int,
    sampling: SamplingConfig,
    seed: int = 0,
    reps: int = 20,
) -> LoopProfile:
    """Profile `decoder` over `prompts` ((T,) int64 each): medians in ms, their bare counterparts, host
    reads per round. Call `decoder.warm_up` first on the fast path."""
    draft_step, verify, verify_tokens, reads, rounds = [], [], [], 0, 0
    for i, prompt in enumerate(prompts):
        res = decoder.generate(prompt, max_new_tokens=max_new_tokens, temperature=sampling.temperature,
                               top_k=sampling.top_k, top_p=sampling.top_p, seed=seed + i, profile=True)
        ph = res.phases
        draft_step += [ms / n for ms, n in zip(ph["draft_ms"], ph["draft_forwards"], strict=True) if n > 0]
        # Each decode's first round also feeds the prompt (a prefill, eager on the fast path): left out.
        verify += ph["verify_ms"][1:]
        verify_tokens += ph["verify_tokens"][1:]
        reads, rounds = reads + res.host_reads, rounds + res.rounds
    # The bare target replay of the verification length the decoder used most (ties: the longest).
    count = max(set(verify_tokens), key=lambda c: (verify_tokens.count(c), c)) if verify_tokens else 1
    drafter = decoder.drafter
    return LoopProfile(
        policy=decoder.policy.spec,
        path="fast" if decoder.fast else "eager",
        rounds=rounds,
        host_reads_per_round=reads / max(rounds, 1),
        verify_ms=statistics.median(verify) if verify else None,
        draft_step_ms=statistics.median(draft_step) if draft_step else None,
        verify_tokens=count,
        bare_target_ms=bare_feed_ms(decoder._runner, prompts[0], count, reps),
        bare_draft_ms=bare_feed_ms(drafter.runner, prompts[0], 1, reps) if isinstance(drafter, ModelDrafter)
        else None,
    )  # fmt: skip


def pick_settings(settings: list[Any]) -> list[Any]:
    """The bench settings to profile: per path, fixed K = 3 (else the first K) and the first SpecDec++ head's
    h = 0.8 (else its first h); settings with another drafter (MaG, cascades) are left out."""
    from acchead.inference.bench.settings import base_family, eager_family

    picked = []
    for fast in (False, True):
        pool = [s for s in settings if s.fast == fast and s.decoding and not s.decoding.uses_drafters]
        for family, key, value in (("specdec", "k", 3), ("specdecpp", "h", 0.8)):
            group = [s for s in pool if base_family(eager_family(s.family)).startswith(family)]
            if group:
                picked.append(next((s for s in group if s.params.get(key) == value), group[0]))
    return picked


def profile_table(rows: list[dict[str, Any]]) -> str:
    """Markdown table of `LoopProfile.to_dict()` rows (results.json's `loop_profile`)."""

    def f(x: float | None, spec: str = ".3f") -> str:
        return "–" if x is None else format(x, spec)

    lines = [
        "| path | policy | draft step ms (bare) | ratio | verify ms, L+1 tokens (bare) | ratio | "
        "host reads / round |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        draft = f"{f(r['draft_step_ms'])} ({f(r['bare_draft_ms'])})"
        verify = f"{f(r['verify_ms'])}, {r['verify_tokens']} ({f(r['bare_target_ms'])})"
        ratios = f(r["draft_step_vs_bare"], ".2f"), f(r["verify_vs_bare"], ".2f")
        lines.append(
            f"| {r['path']} | `{r['policy']}` | {draft} | {ratios[0]} | {verify} | {ratios[1]} | "
            f"{r['host_reads_per_round']:.2f} |"
        )
    return "\n".join(lines)
