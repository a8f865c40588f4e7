"""`acchead-gpu-check --batch-sizes 4,16`: batched decoders (issue 33) on the device, after its speed check.

For each B: batched autoregressive decoding, the speed check's best fixed K, its best SpecDec++ under the
measured batch stop rule (`acchead.inference.batch_stop`: its c(B) timed on this device first) and copy
rounds beside the best K (`acchead.inference.batched_copy`; a round's copy budget of the default 16
positions and of 64: whether a GPU's nearly free verification width pays for longer copies in a batch),
on the run's `--path` (the batched fast path on CUDA's default: static caches, compiled forwards;
`BatchedDecoder(fast=True)`).
The prompts are cycled to B rows. Each decoder is warmed up for B rows (its compilation is reported), its
greedy rows are compared with batched AR's (in float32 they must be equal, each row being the target's
greedy decoding alone; in bfloat16 a near-tie may round another way: reported, not failed), then all are
timed in `--repeats` interleaved rounds and the median tokens/s reported: where SpecDec++ stands against
the better of AR and the best K (issue 33's goal 5: ≥ 0.98×) when a GPU, not a CPU, verifies the batch.
"""

from __future__ import annotations

import statistics
from typing import Any

from acchead.inference.bench.gpu_check_steps import Budget, PairRun, _failure, _progress, timed_rounds
from acchead.inference.policy_spec import AutoregressiveSpec, SpecDecPPSpec
from acchead.inference.spec import split_copy_rounds


def batched_decoder(run: PairRun, dtype: str, spec: str):
    """A `BatchedDecoder` of `spec` ([copy+]POLICY) in `dtype` on the run's path; SpecDec++ with the measured
    batch rule."""
    from acchead.inference.batched import BatchedDecoder

    target, draft = run.models(dtype)
    typed, copy = split_copy_rounds(spec)
    policy, args = typed.policy, run.args
    fast = args.path in ("fast", "device") or (args.path == "default" and args.device == "cuda")
    device_path = run.backend_path or (True if args.path == "device" else None)
    return BatchedDecoder(
        target, None if isinstance(policy, AutoregressiveSpec) else draft, policy,
        head=run.head if policy.needs_head else None,
        batch_stop="measured" if isinstance(policy, SpecDecPPSpec) else False,
        fast=fast, device_path=device_path if fast else None, copy=copy,
    )  # fmt: skip


def measure_batched(
    run: PairRun, dtype: str, specs: list[str], sizes: list[int], budget: Budget
) -> dict[str, Any]:  # fmt: skip
    """Per B of `sizes`: {"rows": {spec: tokens, warm_up_s, tokens_per_s (median), range, equal_to_ar}} and
    the ratios, with the specs that would start past the budget in "skipped" and those that failed to
    compile or replay in "failed" (spec: line). `specs[0]` must be "autoregressive": the reference."""
    assert specs[0] == "autoregressive"
    out: dict[str, Any] = {"dtype": dtype, "sizes": {}, "skipped": [], "failed": {}}
    for size in sizes:
        rows = [run.prompts[i % len(run.prompts)] for i in range(size)]
        longest = max(int(p.numel()) for p in rows) + run.args.max_new_tokens
        decoders, warm, outputs = {}, {}, {}
        for spec in specs:
            if budget.over():
                out["skipped"].append(f"B={size} {spec}")
                continue
            try:
                dec = batched_decoder(run, dtype, spec)
                warm[spec] = dec.warm_up(size, longest, temperature=0.0)
                res = _decode(run, dec, rows)  # a measured rule times its c(B) first: outside the timing
                outputs[spec] = [r.new_ids.tolist() for r in res.rows]
            except RuntimeError as e:
                out["failed"][f"B={size} {spec}"] = _failure(f"B={size} {spec}", run, e)
                continue
            decoders[spec] = dec
            _progress(f"{run.name} batched B={size} {spec}: warm-up {warm[spec]:.1f} s, {res.tokens} tokens")

        def decode(dec, rows: list = rows) -> tuple[int, float]:  # this B's rows
            res = _decode(run, dec, rows)
            return res.tokens, res.wall_time

        tokens, rates = timed_rounds(decoders, run.args.repeats, decode)
        ref = outputs.get("autoregressive")
        table = {
            spec: {"tokens": tokens[spec], "warm_up_s": round(warm[spec], 1),
                   "tokens_per_s": statistics.median(r), "tokens_per_s_range": [min(r), max(r)],
                   "equal_to_ar": None if ref is None else outputs[spec] == ref}
            for spec, r in rates.items()
        }  # fmt: skip
        out["sizes"][size] = {"rows": table, **_ratios(table, specs)}
    return out


def _decode(run: PairRun, dec, rows: list):
    return dec.generate(rows, max_new_tokens=run.args.max_new_tokens, temperature=0.0, eos_token_id=run.eos)


def _ratios(table: dict[str, dict[str, Any]], specs: list[str]) -> dict[str, Any]:
    """SpecDec++ over the better of AR and the best K (goal 5), and the faster copy setting over the best K,
    where timed: specs = [AR, best K, SpecDec++, copy settings beside the best K...]."""
    rate = {s: r["tokens_per_s"] for s, r in table.items()}
    ar, k, pp, *copies = specs
    out: dict[str, Any] = {}
    if ar in rate and k in rate and pp in rate:
        out["specdecpp_over_better"] = rate[pp] / max(rate[ar], rate[k])
    timed = [c for c in copies if c in rate]
    if k in rate and timed:
        best = max(timed, key=rate.get)
        out.update(best_copy=best, copy_over_best_k=rate[best] / rate[k])
    return out


def batched_lines(batched: dict[str, Any], repeats: int, budget_s: float) -> list[str]:
    """The report's section: one table row per (B, spec), then the ratios per B."""
    lines = ["", f"Batched decoding in {batched['dtype']} (prompts cycled to B rows; SpecDec++ under the "
             "measured batch rule):", "",
             f"| B | method | warm-up (s) | tokens a repeat | tokens/s (median of {repeats}) | range "
             "| rows equal to batched AR |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for size, at in batched["sizes"].items():
        for spec, r in at["rows"].items():
            lo, hi = r["tokens_per_s_range"]
            equal = {True: "yes", False: "NO", None: "-"}[r["equal_to_ar"]]
            lines.append(f"| {size} | `{spec}` | {r['warm_up_s']} | {r['tokens']} | {r['tokens_per_s']:.1f} "
                         f"| {lo:.1f}-{hi:.1f} | {equal} |")  # fmt: skip
    for item in batched["skipped"]:
        lines.append(f"| {item} | skipped (past the {budget_s:g} s budget) | | | | | |")
    for item, line in batched["failed"].items():
        lines.append(f"| {item} | FAILED: {line} | | | | | |")
    lines.append("")
    for size, at in batched["sizes"].items():
        said = []
        if "specdecpp_over_better" in at:
            said.append(f"SpecDec++ {at['specdecpp_over_better']:.3f}x the better of AR and the best K")
        if "copy_over_best_k" in at:
            said.append(f"copy rounds `{at['best_copy']}` {at['copy_over_best_k']:.3f}x the best K")
        lines.append(f"- B = {size}: " + ("; ".join(said) if said else "no ratios (not all timed)"))
    return lines
