"""`acchead-bench --batch-size 1,4,16,64`: the bench's batchable settings decoded B prompts at a time.

For each B and each setting the batched decoder runs (`acchead.inference.batched`: autoregressive, fixed K,
SpecDec++ with the batch stop rule at c = 1 − h; eager path, the models' draft), the prompts are decoded
in batches of B (cycled to B rows when there are fewer prompts; row i keeps the single-prompt bench's seed,
`--seed` + its prompt index), and one row is reported per (B, setting): wall-clock tokens/s
(`wall_tokens_per_s`, all batches' tokens over their summed wall time) and the batched forward counts.
Under greedy decoding every row's output is also compared with batched autoregressive decoding's
(`greedy_matches_ar`): they must be equal, as each row equals the target's greedy decoding alone.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from acchead.errors import AccheadError

if TYPE_CHECKING:
    from acchead.inference.bench.config import Setting
    from acchead.inference.bench.run import Bench

BATCHABLE = ("autoregressive", "specdec", "specdecpp")


def batchable(setting: Setting) -> bool:
    """Whether the batched decoder runs `setting`: its policy name is batchable, with the draft model."""
    name = setting.spec.split(":", 1)[0]
    return name in BATCHABLE and "+" not in setting.spec and not setting.fast


def run_batched(bench: Bench, settings: list[Setting], sizes: list[int]) -> list[dict[str, Any]]:
    """One result row per (B, batchable setting), in `sizes` order (see the module docstring)."""
    from acchead.inference.batched import BatchedDecoder

    args, prompts = bench.args, bench.prompt_ids
    if not sizes or min(sizes) < 1:
        raise AccheadError(f"--batch-size needs batch sizes >= 1, got {sizes}")
    chosen = [s for s in settings if batchable(s)]
    rows: list[dict[str, Any]] = []
    for size in sizes:
        index = [i % len(prompts) for i in range(max(size, len(prompts)))]
        ar_digest: list[str] | None = None
        for s in chosen:
            head = s.head if s.needs_head else None
            draft = None if s.spec == "autoregressive" else bench.draft
            rule = s.spec.startswith("specdecpp")
            dec = BatchedDecoder(bench.target, draft, s.spec, head=head, verifier=s.verifier, batch_stop=rule)
            totals = dict.fromkeys(("tokens", "target_calls", "draft_calls", "head_calls", "batch_stops"), 0)
            wall, digests = 0.0, []
            for lo in range(0, len(index), size):
                chunk = index[lo : lo + size]
                res = dec.generate(
                    [prompts[i] for i in chunk], max_new_tokens=args.max_new_tokens,
                    temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                    seed=[args.seed + i for i in chunk], eos_token_id=bench.eos,
                )  # fmt: skip
                wall += res.wall_time
                for k in totals:
                    totals[k] += getattr(res, k)
                digests += [_digest(r.new_ids.tolist()) for r in res.rows]
            row: dict[str, Any] = {
                "batch_size": size, "method": s.family, "spec": s.spec, "verifier": s.verifier,
                "batch_stop": f"c={1 - dec.policy.h:g}" if rule else None, "rows": len(index),
                **totals, "wall_time": wall,
                "wall_tokens_per_s": totals["tokens"] / wall if wall > 0 else 0.0,
            }  # fmt: skip
            if args.temperature == 0:
                if s.spec == "autoregressive":
                    ar_digest = digests
                row["greedy_matches_ar"] = None if ar_digest is None else digests == ar_digest
            rows.append(row)
    return rows


def _digest(ids: list[int]) -> str:
    return hashlib.sha256(str(ids).encode()).hexdigest()[:16]


def batched_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a markdown table, one line per (B, setting), with tokens/s relative to batched AR."""
    lines = [
        "| B | method | spec | wall tokens/s | × AR | target calls | draft calls | batch stops | tokens |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    ar = {r["batch_size"]: r["wall_tokens_per_s"] for r in rows if r["spec"] == "autoregressive"}
    for r in rows:
        base = ar.get(r["batch_size"])
        rel = f"{r['wall_tokens_per_s'] / base:.2f}" if base else "-"
        lines.append(
            f"| {r['batch_size']} | {r['method']} | `{r['spec']}` | {r['wall_tokens_per_s']:.1f} | {rel} | "
            f"{r['target_calls']} | {r['draft_calls']} | {r['batch_stops']} | {r['tokens']} |"
        )
    return "\n".join(lines) + "\n"


def write_batched(rows: list[dict[str, Any]], out: Path) -> None:
    """Append the batched table to OUT/report.md (written before, by `write_outputs`) and write it alone to
    OUT/batched.md; results.json holds the rows under "batched"."""
    from acchead.rundir import atomic_write_text

    table = batched_table(rows)
    report = out / "report.md"
    head = report.read_text() if report.exists() else ""
    atomic_write_text(report, f"{head}\n## Batched decoding (`--batch-size`)\n\n{table}")
    atomic_write_text(out / "batched.md", table)
