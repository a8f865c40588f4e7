"""A draft's cost per token against its target's: multiply-adds and measured step time, side by side.

Issue 31 asks the real pair's draft for c <= 0.15 in both. Multiply-adds per decoded token count what one
KV-cached step computes whatever the context (attention's projections, the MLP, the LM head over the rows
it scores: V_d for a reduced-vocabulary draft, V for the target); attention over the cache itself grows
with the context and is left out (at context 128 it is under 1% of a SmolLM2 layer). Step time is the
median of one-token KV-cached forwards at a given context, target and draft interleaved round by round so
a busy machine slows both alike, and the ratio reported is the median of the rounds' ratios.

    acchead-distill cost --pair smollm2 --threads 1      # the shipped SmolLM2 pair, one thread
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from acchead.feature_draft import FeatureDraftConfig, is_feature_draft
from acchead.kv_decode import KVSequence


def step_multiply_adds(config) -> int:
    """Multiply-adds of one decoded token of a Llama-style model (projections, MLP, head), context-free."""
    h, inter = config.hidden_size, config.intermediate_size
    head_dim = getattr(config, "head_dim", None) or h // config.num_attention_heads
    q = config.num_attention_heads * head_dim
    kv = config.num_key_value_heads * head_dim
    layer = h * q + 2 * h * kv + q * h + 3 * h * inter  # q, k, v, o projections; gate, up, down
    rows = getattr(config, "draft_vocab_size", None) or config.vocab_size  # the head's rows
    fuse = 0  # a feature draft's fc: [embedding; state; fused layers' states] -> H
    if config.model_type == FeatureDraftConfig.model_type:
        fuse = (2 + len(getattr(config, "fused_layers", ()))) * h * h
    return config.num_hidden_layers * layer + rows * h + fuse


def device_sync(device: torch.device | str) -> None:
    """Wait for `device`'s queued work before a clock is read: `torch.cuda.synchronize` on CUDA, nothing on
    the CPU (its ops return when done). The timing code's one CUDA call, so a CPU run takes every line
    around it (`tests/test_device_sync.py` checks each timer calls it around each timed call)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _feed(seq: KVSequence, ids: torch.Tensor) -> None:
    """One KV-cached forward over `ids` (1, n) as the decoders run it (`KVSequence.feed`, the last
    position's logits); a feature draft reads zero states beside the ids (its cost does not depend on
    their values)."""
    feats = None
    if is_feature_draft(seq.model):
        feats = torch.zeros(*ids.shape, seq.model.config.hidden_size, device=ids.device)
    seq.feed(ids, features=feats)


@torch.inference_mode()
def step_seconds(model, context: int, calls: int, seed: int = 0) -> list[float]:
    """Wall seconds of `calls` one-token KV-cached forwards after a `context`-token prefill (the cache is
    cropped back after each, so every call sees the same context), synchronised on CUDA."""
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(1, model.config.vocab_size, (1, context), generator=g).to(device)
    seq = KVSequence(model)
    _feed(seq, x)
    token, times = x[:, -1:], []
    for _ in range(calls):
        device_sync(device)
        t = time.perf_counter()
        _feed(seq, token)
        device_sync(device)
        times.append(time.perf_counter() - t)
        seq.crop(context)  # remove the token just added
    return times


def decode_step_ms(model, context: int = 256, calls: int = 100) -> float:
    """Median ms of a one-token KV-cached forward at `context` tokens, after 10 warm-up calls."""
    return 1e3 * statistics.median(step_seconds(model, context, calls + 10)[10:])


@dataclass(frozen=True)
class CostReport:
    """The draft's cost per token relative to the target's."""

    target_macs: int
    draft_macs: int
    mac_ratio: float  # draft / target multiply-adds
    target_ms: float  # median step, over all rounds
    draft_ms: float
    time_ratio: float  # median over rounds of (draft median / target median)
    rounds: int
    context: int
    threads: int

    def lines(self, goal: float | None = None) -> list[str]:
        """Two printable lines (multiply-adds, step time), each c compared with `goal` when given."""

        def verdict(ratio: float) -> str:
            return "" if goal is None else f"  ({'<=' if ratio <= goal else '>'} {goal})"

        return [
            f"multiply-adds per token: target {self.target_macs / 1e6:.1f}M, draft "
            f"{self.draft_macs / 1e6:.1f}M, c = {self.mac_ratio:.3f}{verdict(self.mac_ratio)}",
            f"step at context {self.context} ({self.threads} thread(s), {self.rounds} interleaved rounds): "
            f"target {self.target_ms:.2f} ms, draft {self.draft_ms:.2f} ms, c = {self.time_ratio:.3f}"
            f"{verdict(self.time_ratio)}",
        ]  # fmt: skip


def measure_cost(target, draft, context: int = 128, calls: int = 30, rounds: int = 5) -> CostReport:
    """Multiply-adds of both models and their step times, interleaved over `rounds` (each round: 5 warm-up
    and `calls` timed steps of each model)."""
    target_all, draft_all, ratios = [], [], []
    for r in range(rounds):
        t = step_seconds(target, context, calls + 5, seed=r)[5:]
        d = step_seconds(draft, context, calls + 5, seed=r)[5:]
        target_all += t
        draft_all += d
        ratios.append(statistics.median(d) / statistics.median(t))
    tm, dm = step_multiply_adds(target.config), step_multiply_adds(draft.config)
    return CostReport(
        target_macs=tm, draft_macs=dm, mac_ratio=dm / tm, target_ms=1e3 * statistics.median(target_all),
        draft_ms=1e3 * statistics.median(draft_all), time_ratio=statistics.median(ratios), rounds=rounds,
        context=context, threads=torch.get_num_threads(),
    )  # fmt: skip
