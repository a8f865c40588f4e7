"""The steps of `acchead-gpu-check` (`acchead.inference.bench.gpu_check`): one pair's models, decoders and
prompts (`PairRun`), greedy exactness against eager autoregressive decoding (`check_exactness`) and
interleaved wall-clock timing (`measure_speed`), each under the run's deadline (`Budget`)."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from acchead.errors import AccheadError
from acchead.inference.drafter_spec import CopySpec
from acchead.inference.policy_spec import AutoregressiveSpec, SpecDecPPSpec, SpecDecSpec
from acchead.inference.spec import DecodingSpec, split_copy_rounds

if TYPE_CHECKING:
    from acchead.inference.device_path import DevicePath

DEFAULT_PROMPTS = {"toy": "humaneval", "smollm2": "mtbench"}


class PairRun:
    """One pair on one device: its models per dtype, tokenizer, prompts and head. `backend_path`: the
    device path with a compile backend other than Inductor (`--backend`), for decoders not on --path eager."""

    def __init__(self, args: argparse.Namespace, name: str, backend_path: DevicePath | None = None) -> None:
        from acchead.models import load_tokenizer
        from acchead.pairs import default_heads, resolve_pair
        from acchead.prompt_sources import load_prompts
        from acchead.prompting import encode_prompt
        from acchead.sampling import SamplingConfig

        self.args, self.name, self.backend_path = args, name, backend_path
        self.paths = resolve_pair(name, args.target, args.draft)  # AccheadError names what is missing
        heads = [Path(args.head)] if args.head else default_heads(name, SamplingConfig(0.0))
        if not heads:
            raise AccheadError(f"pair {name}: no shipped greedy head (pass --head)")
        self.head = heads[0]
        self.tok = load_tokenizer(self.paths.target)
        prompts = load_prompts(args.prompts or DEFAULT_PROMPTS[name], args.num_prompts)
        self.prompts = [torch_ids(encode_prompt(self.tok, p)) for p in prompts]
        self.eos = self.tok.eos_token_id
        self._models: dict[str, tuple] = {}

    def models(self, dtype: str) -> tuple:
        if dtype not in self._models:
            from acchead.models import load_causal_lm

            dev = self.args.device
            self._models[dtype] = (
                load_causal_lm(self.paths.target, dtype, dev),
                load_causal_lm(self.paths.draft, dtype, dev),
            )
        return self._models[dtype]

    def decoder(self, dtype: str, spec: str, path: str = "eager"):
        """A decoder of `spec` in `dtype` on `path` (see --path)."""
        from acchead.inference.decoder import SpeculativeDecoder

        target, draft = self.models(dtype)
        typed, copy = split_copy_rounds(spec)  # [copy+]POLICY
        policy = typed.policy
        head = self.head if policy.needs_head else None
        fast, device_path = _PATHS[path]
        if self.backend_path is not None and path != "eager":
            device_path = self.backend_path
        drafter = None if isinstance(policy, AutoregressiveSpec) else draft
        return SpeculativeDecoder(target, drafter, policy, head=head, fast=fast, device_path=device_path,
                                  copy=copy)  # fmt: skip

    def greedy(self, dec, prompt) -> tuple[list[int], float]:
        res = dec.generate(
            prompt, max_new_tokens=self.args.max_new_tokens, temperature=0, eos_token_id=self.eos
        )
        return res.new_ids.tolist(), res.wall_time


def torch_ids(ids: list[int]):
    import torch

    return torch.tensor(ids, dtype=torch.long)


_PATHS = {"default": (None, None), "eager": (False, None), "fast": (True, None), "device": (None, True)}


def _warm(dec, run: PairRun) -> float:
    """Seconds `warm_up` took for the longest prompt (compilation, on the fast path)."""
    start = time.perf_counter()
    dec.warm_up(max(p.numel() for p in run.prompts) + run.args.max_new_tokens)
    return time.perf_counter() - start


def _failure(spec: str, run: PairRun, e: RuntimeError) -> str:
    """One line for a decoder that failed to compile or replay (torch's compile and CUDA-graph errors are
    RuntimeErrors): the check goes on with the others, as a freshly lent GPU's minutes are few (an H200's
    Inductor error on the real pair, 2026-11-28, ended a whole run with a traceback)."""
    first = next((line for line in str(e).splitlines() if line.strip()), "")
    line = f"{type(e).__name__}: {first}"[:300]
    _progress(f"{run.name} {spec}: FAILED ({line})")
    return line


def _progress(line: str) -> None:
    """One line per finished check on stderr, so a run cut short still shows what it measured."""
    print(f"[gpu-check] {line}", file=sys.stderr, flush=True)


class Budget:
    """The run's deadline: `over()` once `seconds` have passed since it was made."""

    def __init__(self, seconds: float) -> None:
        self.end = time.perf_counter() + seconds

    def over(self) -> bool:
        return time.perf_counter() >= self.end

    def remaining(self) -> float:
        """Seconds until the deadline (0 once past it)."""
        return max(0.0, self.end - time.perf_counter())


def check_exactness(run: PairRun, dtype: str, specs: list[str], budget: Budget) -> dict[str, Any]:
    """Each spec's greedy tokens on the chosen path against eager AR greedy decoding in `dtype`; a spec
    that would start past the budget is {"skipped": True}, one that fails to compile or replay
    {"failed": its error's first line}."""
    if budget.over():
        return {spec: {"skipped": True} for spec in specs}
    ref_dec = run.decoder(dtype, "autoregressive", "eager")
    refs = [run.greedy(ref_dec, p)[0] for p in run.prompts]
    out = {}
    for spec in specs:
        if budget.over():
            out[spec] = {"skipped": True}
            continue
        try:
            dec = run.decoder(dtype, spec, run.args.path)
            _warm(dec, run)
            gots = [run.greedy(dec, p)[0] for p in run.prompts]
        except RuntimeError as e:
            out[spec] = {"failed": _failure(spec, run, e)}
            continue
        diffs = []
        for i, (got, ref) in enumerate(zip(gots, refs, strict=True)):
            if got != ref:
                at = next(
                    (j for j, (a, b) in enumerate(zip(got, ref, strict=False)) if a != b),
                    min(len(got), len(ref)),
                )
                diffs.append(f"prompt {i} from token {at}")
        out[spec] = {"equal": not diffs, "differs": diffs, "fast": dec.fast, "device_path": dec.path.on}
        _progress(f"{run.name} exactness {dtype} {spec}: " + ("equal" if not diffs else "differs"))
    return out


def measure_speed(
    run: PairRun, dtype: str, specs: list[str], budget: Budget, keep: dict | None = None
) -> dict[str, Any]:  # fmt: skip
    """tokens/s per spec: every spec is warmed up (and decoded once, untimed) first, then all are timed in
    `--repeats` interleaved rounds (all prompts' tokens over their summed wall time, per round), and the
    median round is reported with the rounds' range. Interleaving puts every decoder under the same drift
    of the machine (an H100 run of one round each saw AR move 351 -> 486 tokens/s between two runs).
    Warm-up seconds are summed over the specs; specs whose warm-up would start past the budget are listed
    in "skipped", those that fail to compile or replay in "failed" (spec: line), and the ratios need AR, a
    fixed K and a SpecDec++ setting among those timed."""
    decoders, warm, skipped, failed = {}, {}, [], {}
    for spec in specs:
        if budget.over():
            skipped.append(spec)
            continue
        try:
            dec = run.decoder(dtype, spec, run.args.path)
            warm[spec] = _warm(dec, run)
            run.greedy(dec, run.prompts[0])  # first-call costs (allocator, caches) out of the timing
        except RuntimeError as e:
            failed[spec] = _failure(spec, run, e)
            continue
        decoders[spec] = dec
        if keep is not None:  # warmed decoders, for a profile after the timing (`profile_decode`)
            keep[spec] = dec
        _progress(f"{run.name} speed {dtype} {spec}: warm-up {warm[spec]:.1f} s")

    def decode(dec) -> tuple[int, float]:  # every prompt's tokens and summed wall seconds
        walls = [run.greedy(dec, p) for p in run.prompts]
        return sum(len(ids) for ids, _ in walls), sum(wall for _, wall in walls)

    tokens, rates = timed_rounds(decoders, run.args.repeats, decode)
    rows = {}
    for spec, r in rates.items():
        rows[spec] = {
            "tokens": tokens[spec],
            "warm_up_s": round(warm[spec], 1),
            "tokens_per_s": statistics.median(r),
            "tokens_per_s_range": [min(r), max(r)],
        }
        _progress(f"{run.name} speed {dtype} {spec}: {rows[spec]['tokens_per_s']:.1f} tokens/s (median)")
    out: dict[str, Any] = {
        "rows": rows, "warm_up_s": round(sum(warm.values()), 1), "skipped": skipped, "failed": failed,
    }  # fmt: skip
    typed = {s: DecodingSpec.from_spec(s) for s in rows}
    kinds = {s: None if t.drafter is not None else type(t.policy) for s, t in typed.items()}
    fixed = {s: r["tokens_per_s"] for s, r in rows.items() if kinds[s] is SpecDecSpec}
    adaptive = {s: r["tokens_per_s"] for s, r in rows.items() if kinds[s] is SpecDecPPSpec}
    copies = {s: r["tokens_per_s"] for s, r in rows.items() if isinstance(typed[s].drafter, CopySpec)}
    if "autoregressive" not in rows or not fixed or not adaptive:
        return out
    ar = rows["autoregressive"]["tokens_per_s"]
    best_k = max(fixed, key=fixed.get)
    best_pp = max(adaptive, key=adaptive.get)
    pp = adaptive[best_pp]
    best_copy = max(copies, key=copies.get) if copies else None  # copy rounds beside the draft's
    return {
        **out,
        "best_fixed": best_k,
        "best_specdecpp": best_pp,
        "specdecpp_over_ar": pp / ar,
        "specdecpp_over_best_k": pp / fixed[best_k],
        "best_k_over_ar": fixed[best_k] / ar,
        **({"best_copy": best_copy, "copy_over_ar": copies[best_copy] / ar,
            "copy_over_best_k": copies[best_copy] / fixed[best_k]} if best_copy else {}),
    }  # fmt: skip


def timed_rounds(
    decoders: dict[str, Any], repeats: int, decode: Callable[[Any], tuple[int, float]]
) -> tuple[dict[str, int], dict[str, list[float]]]:
    """`repeats` interleaved rounds over the decoders (`decode(dec)`: tokens and wall seconds): each spec's
    tokens a round and its tokens/s per round."""
    rates: dict[str, list[float]] = {spec: [] for spec in decoders}
    tokens: dict[str, int] = {}
    for _ in range(repeats):
        for spec, dec in decoders.items():
            n, seconds = decode(dec)
            tokens[spec] = n
            rates[spec].append(n / max(seconds, 1e-9))
    return tokens, rates


def profile_decode(run: PairRun, dtype: str, spec: str, budget: Budget, warmed: dict) -> dict[str, Any]:
    """One greedy decode of the first prompt by `spec` under `torch.profiler` (the CPU's activity, and the
    GPU's on CUDA), with the decoder the speed check warmed when it has one: wall and device milliseconds a
    token, the stream syncs, CUDA-graph launches and kernel launches the decode made, and the operators with
    the most self time. Where a token's time goes when the models are small: an H200 decoded the toy pair's
    7M-parameter target at 5.5 ms a token, a CPU runs the same loop at 0.23 (docs/speed.md)."""
    from torch.profiler import ProfilerActivity, profile

    dec = warmed.get(spec)
    if dec is None and budget.over():  # a warmed decoder's one decode costs seconds: it runs past the budget
        return {"spec": spec, "skipped": True}
    try:
        if dec is None:
            dec = run.decoder(dtype, spec, run.args.path)
            _warm(dec, run)
            run.greedy(dec, run.prompts[0])
        cuda = run.args.device == "cuda"
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=activities) as prof:
            ids, wall = run.greedy(dec, run.prompts[0])
    except RuntimeError as e:
        return {"spec": spec, "failed": _failure(spec, run, e)}
    events = prof.key_averages()
    device_us = sum(e.self_device_time_total for e in events)  # each kernel counted once, as self time
    n = max(len(ids), 1)
    kinds = ("Synchronize", "GraphLaunch", "LaunchKernel")  # cudaStreamSynchronize, cudaGraphLaunch, ...
    calls = {k: sum(e.count for e in events if k in e.key) for k in kinds}
    sort = "self_device_time_total" if cuda else "self_cpu_time_total"
    out = {
        "spec": spec,
        "tokens": len(ids),
        "wall_ms_per_token": 1000 * wall / n,
        "device_ms_per_token": device_us / 1000 / n,
        "calls": calls,
        "table": events.table(sort_by=sort, row_limit=15),
    }
    _progress(f"{run.name} profile {spec}: {out['wall_ms_per_token']:.2f} ms a token, "
              f"{out['device_ms_per_token']:.2f} on the device")  # fmt: skip
    return out
