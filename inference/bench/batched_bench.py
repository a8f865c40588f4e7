"""`acchead-bench --batch-size 1,4,16,64`: the bench's batchable settings decoded B prompts at a time.

For each B and each setting the batched decoder runs (`acchead.inference.batched`: autoregressive, fixed K,
SpecDec++ with each batch stop rule of `--batch-stop`, confidence, entropy; the models' draft; each of
`--paths`, a fast-path setting compiled for the batch size before its timed passes),
the prompts are decoded in batches of B (cycled to B rows when there are fewer prompts; row i keeps the
single-prompt bench's seed, `--seed` + its prompt index), and one row is reported per (B, setting, rule):
wall-clock tokens/s (`wall_tokens_per_s`, all batches' tokens over their summed wall time, averaged over
PASSES passes) and the batched forward counts. At B = 1 each setting's single-prompt decoder (the
`SpeculativeDecoder` the bench's grid times) takes its turns among the batched runs, prompt by prompt, so
`single_wall_tokens_per_s` compares the two paths on the same prompts in the same minutes.
Under greedy decoding every row's output is also compared with batched autoregressive decoding's
(`greedy_matches_ar`): they must be equal, as each row equals the target's greedy decoding alone.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from acchead.errors import AccheadError
from acchead.inference.drafter_spec import CopySpec
from acchead.inference.policy_spec import (
    AdaEDLSpec,
    AutoregressiveSpec,
    ConfidenceSpec,
    EntropySpec,
    SpecDecPPSpec,
    SpecDecSpec,
)

if TYPE_CHECKING:
    from acchead.inference.bench.run import Bench
    from acchead.inference.bench.settings import Setting

BATCHABLE = (AutoregressiveSpec, SpecDecSpec, SpecDecPPSpec, ConfidenceSpec, EntropySpec, AdaEDLSpec)
PASSES = 2  # every batch runs twice per setting (the timings' spread; counts are the same each pass)


@dataclass(frozen=True)
class BatchedRow:
    """One (B, setting) row of `results.json`'s "batched" list.

    batch_size: B, prompts per forward; rows: prompts decoded (the prompts cycled to at least B);
    passes: times every batch ran. Counts (tokens, target_calls, draft_calls, head_calls, batch_stops,
    gate_rounds: the rounds the round gate decoded autoregressively, `acchead.inference.round_gate`;
    copied_rounds: the rows' rounds that copied their context, `acchead.inference.batched_copy`) are
    one pass's sums over the batches; wall_time is a pass's summed wall time in seconds (mean over passes),
    wall_tokens_per_s = tokens / wall_time. batch_stop: the batch stop rule (`batch-stop:c=0.5`) or None.
    greedy_matches_ar: under greedy decoding, whether every output equals batched autoregressive
    decoding's (None without an autoregressive row); absent from the JSON under sampling.
    gate_caps: under the round gate, how many decodes of all passes ended at each cap, keyed by the cap
    (`BatchResult.gate_cap`), with a `*` where the decode explored (`{"3": 28, "1*": 2}`); None without it.
    single_wall_tokens_per_s: at B = 1, the single-prompt decoder's tokens/s on the same prompts, timed in
    the same passes interleaved with the batched runs (None at B > 1, and for a batch rule's second row).
    """

    batch_size: int
    method: str
    spec: str
    verifier: str
    batch_stop: str | None
    rows: int
    passes: int
    tokens: int
    target_calls: int
    draft_calls: int
    head_calls: int
    batch_stops: int
    wall_time: float
    wall_tokens_per_s: float
    greedy: bool
    greedy_matches_ar: bool | None = None
    single_wall_tokens_per_s: float | None = None
    gate_rounds: int = 0
    copied_rounds: int = 0
    gate_caps: dict[str, int] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The row as results.json stores it (`greedy_matches_ar` only under greedy decoding)."""
        data = asdict(self)
        del data["greedy"]
        if not self.greedy:
            del data["greedy_matches_ar"]
        return data


def batchable(setting: Setting) -> bool:
    """Whether the batched decoder runs `setting`: a batchable policy drafted by the draft model, with or
    without copy rounds (either path: a fast-path setting runs `BatchedDecoder(fast=True)`)."""
    spec = setting.decoding
    if spec is None:
        return False
    return isinstance(spec.policy, BATCHABLE) and (spec.drafter is None or isinstance(spec.drafter, CopySpec))


def run_batched(bench: Bench, settings: list[Setting], sizes: list[int]) -> list[BatchedRow]:
    """One result row per (B, batchable setting, batch rule), in `sizes` order (see the module docstring):
    a specdecpp setting once per rule of `--batch-stop` (a measured rule times its c(B) in its first
    `generate`, outside the wall time: `BatchedDecoder.calibrate`), every other setting once.

    Within a B, the settings take turns batch by batch, in a seeded random order per batch and pass, and
    every batch runs PASSES times: a slow drift of the machine's load (other jobs) then spreads over the
    settings instead of falling on whichever ran while a neighbour was busy. At B = 1 the settings'
    single-prompt decoders take turns with them.
    """
    args = bench.args
    if not sizes or min(sizes) < 1:
        raise AccheadError(f"--batch-size needs batch sizes >= 1, got {sizes}")
    chosen = [s for s in settings if batchable(s)]
    # a run per (setting, batch rule): the specdecpp settings once per rule of --batch-stop (with copy
    # rounds, measured in place of gated: BatchedDecoder refuses the gate there), the others once
    runs = [(s, rule) for s in chosen for rule in _rules(s, args.batch_stop)]
    rows: list[BatchedRow] = []
    made: dict = {}  # one batched decoder per run for every B, as a server keeps one (its gate's memory)
    for size in sizes:
        decs = _decoders(bench, runs, chosen, size, made)
        index = [i % len(bench.prompt_ids) for i in range(max(size, len(bench.prompt_ids)))]
        tallies = _timed_passes(bench, decs, runs, chosen, index, size)
        ar = next((tallies[_key(s, r)].digests for s, r in runs if _is_ar(s)), None)
        greedy = args.temperature == 0
        twinned: set[str] = set()
        for s, rule in runs:
            key = _key(s, rule)
            t, batch_stop = tallies[key], decs[key].batch_stop
            # the single-prompt twin once per setting: beside its first (setting, rule) row
            one = None if s.key in twinned else tallies.get(_single_key(s))
            twinned.add(s.key)
            rows.append(BatchedRow(
                batch_size=size, method=s.family, spec=s.spec, verifier=s.verifier,
                batch_stop=str(batch_stop) if batch_stop else None, rows=len(index), passes=PASSES,
                **t.counts, wall_time=t.wall / PASSES, wall_tokens_per_s=t.tokens_per_s,
                greedy=greedy, greedy_matches_ar=None if ar is None or not greedy else t.digests == ar,
                single_wall_tokens_per_s=one.tokens_per_s if one else None,
                gate_caps=dict(sorted(t.gates.items())) or None,
            ))  # fmt: skip
    return rows


def _rules(setting: Setting, rules: list[str]) -> list[str | None]:
    """The batch rules a setting runs under (see `run_batched`): with copy rounds, whose gains the round
    gate cannot read (BatchedDecoder refuses the two together), `gated` runs as `measured`, its rule
    without the gate (once, where both are asked for)."""
    if not isinstance(setting.decoding.policy, SpecDecPPSpec):
        return [None]
    if isinstance(setting.decoding.drafter, CopySpec):
        rules = ["measured" if r.lower() == "gated" else r for r in rules]
    return list({r.lower(): r for r in rules}.values()) or [None]  # each rule once, in its first place


COUNTS = (
    "tokens", "target_calls", "draft_calls", "head_calls", "batch_stops", "gate_rounds", "copied_rounds"
)  # fmt: skip


@dataclass
class _Tally:
    """One decoder's sums at one B: counts and output digests of the first pass (every pass decodes the
    same), wall seconds and tokens of all passes, the round gate's caps of all passes (decodes per cap)."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTS, 0))
    gates: Counter[str] = field(default_factory=Counter)
    digests: list[str] = field(default_factory=list)
    wall: float = 0.0
    tokens: int = 0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall if self.wall > 0 else 0.0


def _decoders(
    bench: Bench, runs: list[tuple[Setting, str | None]], chosen: list[Setting], size: int, made: dict
) -> dict:
    """The decoders timed at B = `size`, by key: a `BatchedDecoder` per run (`made`'s, made on first use and
    kept for every B: a measured rule's c(B) and a gated rule's memory carry over) and, at B = 1, each
    setting's single-prompt decoder; the fast path's forwards compiled now, outside the timed passes."""
    from acchead.inference.batched import BatchedDecoder

    args = bench.args
    longest = max(int(p.shape[-1]) for p in bench.prompt_ids) + args.max_new_tokens  # (1, T) ids each
    sampling = {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p}
    start, decs = time.perf_counter(), {}
    for s, rule in runs:
        key = _key(s, rule)
        if key not in made:
            copy = s.decoding.drafter if isinstance(s.decoding.drafter, CopySpec) else None
            made[key] = BatchedDecoder(
                bench.target, None if _is_ar(s) else bench.draft, s.decoding.policy, head=s.head,
                verifier=s.verifier, batch_stop=rule or False, fast=s.fast, copy=copy,
            )  # fmt: skip
        decs[key] = dec = made[key]
        dec.warm_up(size, longest, **sampling)
    for s in chosen if size == 1 else []:  # mostly compiled by the bench's grid (a model's decoders share)
        decs[_single_key(s)] = dec = bench.decoder(s)
        if s.fast:
            dec.warm_up(longest, **sampling)
    if any(s.fast for s in chosen):
        print(f"batched fast path: B = {size} compiled in {time.perf_counter() - start:.1f} s")
    return decs


def _timed_passes(
    bench: Bench, decs: dict, runs: list[tuple[Setting, str | None]], chosen: list[Setting],
    index: list[int], size: int,
) -> dict[str, _Tally]:  # fmt: skip
    """PASSES passes over the prompts `index` in batches of `size`, the decoders taking turns batch by batch
    in a seeded random order (see `run_batched`)."""
    from tqdm import tqdm

    args, prompts = bench.args, bench.prompt_ids
    tallies = {key: _Tally() for key in decs}
    turns = runs + ([(s, _SINGLE) for s in chosen] if size == 1 else [])
    chunks = [index[lo : lo + size] for lo in range(0, len(index), size)]
    bar = tqdm(total=PASSES * len(chunks) * len(turns), desc=f"batched B={size}", unit="batch",
               dynamic_ncols=True)  # fmt: skip
    for p in range(PASSES):
        for c, chunk in enumerate(chunks):
            order = list(turns)
            random.Random(args.seed * 100_003 + size * 1_009 + p * 101 + c).shuffle(order)
            for s, rule in order:
                bar.set_postfix_str(f"{s.spec} {rule or ''}".strip())
                single = rule is _SINGLE
                key = _single_key(s) if single else _key(s, rule)
                if single:
                    res = bench.run_one(s, decs[key], chunk[0])
                else:
                    res = decs[key].generate(
                        [prompts[i] for i in chunk], max_new_tokens=args.max_new_tokens,
                        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                        seed=[args.seed + i for i in chunk], eos_token_id=bench.eos,
                    )  # fmt: skip
                t = tallies[key]
                t.wall, t.tokens = t.wall + res.wall_time, t.tokens + res.tokens
                if not single and res.gate_cap is not None:
                    t.gates[f"{res.gate_cap}{'*' if res.gate_explored else ''}"] += 1
                if p == 0 and not single:  # counts and outputs are the same every pass
                    for k in COUNTS:
                        t.counts[k] += getattr(res, k)
                    t.digests += [_digest(r.new_ids.tolist()) for r in res.rows]
                bar.update()
    bar.close()
    return tallies


def _is_ar(setting: Setting) -> bool:
    return isinstance(setting.decoding.policy, AutoregressiveSpec)


_SINGLE = "single-prompt"  # the turn of a setting's single-prompt decoder at B = 1


def _key(setting: Setting, rule: str | None) -> str:
    return f"{setting.key}|{rule}"


def _single_key(setting: Setting) -> str:
    return f"{setting.key}|{_SINGLE}"


def _digest(ids: list[int]) -> str:
    return hashlib.sha256(str(ids).encode()).hexdigest()[:16]


def batched_table(rows: list[BatchedRow]) -> str:
    """The rows as a markdown table, one line per (B, setting, batch rule), with tokens/s relative to batched
    AR and, at B = 1, to the setting's single-prompt decoder timed beside it; the rule column shows a
    measured rule's c at the row's B (results.json keeps its whole table)."""
    lines = [
        "| B | method | spec | batch rule | wall tokens/s | × AR | × single-prompt | target calls "
        "| draft calls | batch stops | gated rounds | tokens |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    ar = {r.batch_size: r.wall_tokens_per_s for r in rows if r.spec == "autoregressive"}
    for r in rows:
        base = ar.get(r.batch_size)
        rel = f"{r.wall_tokens_per_s / base:.2f}" if base else "-"
        one = r.single_wall_tokens_per_s
        single = f"{r.wall_tokens_per_s / one:.2f} ({one:.1f} tokens/s)" if one else "-"
        lines.append(
            f"| {r.batch_size} | {r.method} | `{r.spec}` | {_rule_cell(r)} | {r.wall_tokens_per_s:.1f} "
            f"| {rel} | {single} | {r.target_calls} | {r.draft_calls} | {r.batch_stops} | {r.gate_rounds} "
            f"| {r.tokens} |"
        )
    gated = [r for r in rows if r.gate_caps]
    if gated:  # how the round gate decided: decodes per cap, over every pass
        lines += ["", "Round gate: decodes per cap at the decode's end, all passes (`*`: it explored):", ""]
        for r in gated:
            caps = sorted(r.gate_caps.items(), key=lambda kv: (int(kv[0].rstrip("*")), kv[0]))
            lines.append(f"- B = {r.batch_size}, {r.method}: " + ", ".join(f"cap {k} ×{n}" for k, n in caps))
    return "\n".join(lines) + "\n"


def _rule_cell(row: BatchedRow) -> str:
    """`c=0.2` for a declared rule, `measured, c=0.41` (c at the row's B) for a measured one (`gated, ...`
    with the round gate), `-` for none."""
    rule = row.batch_stop
    if rule is None:
        return "-"
    if "(" not in rule:
        return rule.removeprefix("batch-stop:")
    name, costs = rule.removeprefix("batch-stop:").split("(", 1)
    table = dict(item.split(":c=") for item in costs.rstrip(")").split(",") if ":c=" in item)
    c = table.get(f"B{row.batch_size}")
    return f"{name}, c={c}" if c is not None else name


def write_batched(rows: list[BatchedRow], out: Path) -> None:
    """Append the batched table to OUT/report.md (written before, by `write_outputs`) and write it alone to
    OUT/batched.md; results.json holds the rows under "batched"."""
    from acchead.rundir import atomic_write_text

    table = batched_table(rows)
    report = out / "report.md"
    head = report.read_text() if report.exists() else ""
    atomic_write_text(report, f"{head}\n## Batched decoding (`--batch-size`)\n\n{table}")
    atomic_write_text(out / "batched.md", table)
