"""`acchead-bench`: every stop policy on one prompt set, counted, timed, fitted, plotted and reported.

    acchead-bench --prompts humaneval --num-prompts 20 --out runs/bench
    acchead-bench --prompts my.jsonl --methods autoregressive,specdec,hf-assisted --k-grid 2,4

For each method and setting (autoregressive; SpecDec over a K grid; SpecDec++ over an h grid, once per
acceptance head, so candidate and lookahead heads run side by side as families `specdecpp` and
`specdecpp-lookahead`; the draft-confidence, entropy and AdaEDL rules over their grids; the hindsight
oracle; transformers' assisted generation; any extra policy specs from the config) the bench decodes the
same prompts with the same per-prompt seeds and records the counts and wall time of every prompt. The unit
costs t_draft, t_target are fitted over the per-prompt runs of our draft-model decoders (paper §4.2);
`results.json`, `pareto.png` and `report.md` follow from them (see `acchead.inference.bench.report`); the head
overhead is timed per head. Every finished run is saved under `OUT/partial/` (atomic, fsynced write),
so a killed bench picks up where it stopped when re-run with the same settings; OUT is locked for the run
and another run's OUT is refused (`acchead.rundir`).
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from acchead.errors import AccheadError, cli_errors
from acchead.inference.bench.config import build_parser, resolve_args
from acchead.inference.bench.partials import (
    PromptRun,
    load_partial,
    output_digest,
    partial_path,
    run_fingerprint,
    run_identity,
    run_key,
    save_partial,
)
from acchead.inference.bench.settings import (
    FIT_FAMILIES,
    Setting,
    build_settings,
    is_fitted,
    used_heads,
)
from acchead.prompt_sources import encode_prompts, load_prompts
from acchead.rundir import locked_run, mark_complete, remove_stale_tmp
from acchead.sampling import SamplingConfig

# torch, tqdm, numpy (costmodel) and the modules that need them load where they are used: `--help` and bad
# flags must not wait seconds for torch.
if TYPE_CHECKING:

    from acchead.inference.bench.batched_bench import BatchedRow
    from acchead.inference.bench.costmodel import CostFit


class Bench:
    """The loaded models and encoded prompts; builds a decoder per setting and runs one prompt at a time."""

    def __init__(self, args: argparse.Namespace, target, draft, tokenizer, prompt_ids, eos):
        self.args = args
        self.tokenizer = tokenizer
        self._bigram = None
        self.target, self.draft = target, draft
        self.prompt_ids = prompt_ids
        self.eos = eos
        self.sampling = SamplingConfig(args.temperature, args.top_k, args.top_p)
        self.warm_up_s: float | None = None  # seconds the fast path's warm-up took (compilation), if it ran

    def decoder(self, setting: Setting):
        """A fresh decoder for `setting`'s decoding spec. Its head is a path, not a loaded module: the
        decoder then checks the head against the draft and warns when the head was trained under another
        sampling configuration than the bench's. MaG's bigram table is built only for a spec that names a
        drafter (MaG or a cascade, or a bandit arm's)."""
        from acchead.inference.decoder_factory import build_decoder

        assert setting.decoding is not None, f"{setting.family} is not decoded by our decoders"
        bigram = self.bigram() if setting.decoding.needs_bigram else None
        return build_decoder(setting.decoding, self.target, self.draft, bigram=bigram)

    def bigram(self):
        """MaG's bigram table over the demo corpus (the stdlib LM-train split of `acchead.demo_pair`) under
        our tokenizer, built once and cached on disk. The bench names the corpus; MaG knows none."""
        if self._bigram is None:
            from acchead.demo_pair import split_files
            from acchead.inference.mag import corpus_bigram_table

            self._bigram = corpus_bigram_table(self.tokenizer, split_files()[0])
        return self._bigram

    def run_one(self, setting: Setting, decoder, i: int, max_new_tokens: int | None = None) -> PromptRun:
        """Decode prompt `i` under `setting` (`decoder` is None for transformers' generate / assisted and
        for our decoder through transformers' generate, hf-custom)."""
        from acchead.inference.bench.hf_assisted import HF_METHODS, hf_assisted_generate
        from acchead.inference.bench.hf_assisted import METHOD as HF_METHOD
        from acchead.inference.bench.hf_custom import METHOD as CUSTOM_METHOD
        from acchead.inference.bench.hf_custom import hf_custom_generate

        ids = self.prompt_ids[i]
        max_new_tokens = max_new_tokens or self.args.max_new_tokens
        seed = self.args.seed + i  # the same per-prompt seed for every method
        s = self.sampling
        if setting.family in HF_METHODS:
            res = hf_assisted_generate(
                self.target,
                self.draft if setting.family == HF_METHOD else None,
                ids,
                max_new_tokens=max_new_tokens,
                sampling=s,
                seed=seed,
                eos_token_id=self.eos,
            )
        elif setting.family == CUSTOM_METHOD:
            res = hf_custom_generate(
                self.target,
                self.draft,
                ids,
                spec=replace(setting.decoding, path="fast" if setting.fast else "eager"),
                max_new_tokens=max_new_tokens,
                sampling=s,
                seed=seed,
                eos_token_id=self.eos,
            )
        else:
            res = decoder.generate(
                ids,
                max_new_tokens=max_new_tokens,
                temperature=s.temperature,
                top_k=s.top_k,
                top_p=s.top_p,
                seed=seed,
                eos_token_id=self.eos,
            )
        # Wall time as measured inside each generate call (ours and transformers'): generation only, and
        # for the oracle without its hindsight reference run.
        return PromptRun(
            prompt=i,
            tokens=int(res.tokens),
            target_calls=int(res.target_calls),
            draft_calls=int(res.draft_calls),
            discarded=int(res.discarded),
            wall_time=float(res.wall_time),
            output_sha=output_digest(res.new_ids),
        )

    def warm_up(self, settings: list[Setting], decoders: dict[str, Any]) -> None:
        """One short untimed decode per method family, so first-call costs stay out of the timings; on the
        fast path, every forward shape of every decoder compiled first (decoders of one model share them)."""
        longest = max(ids.shape[1] for ids in self.prompt_ids) + self.args.max_new_tokens
        start = time.perf_counter()
        for s in settings:
            if s.fast:
                decoders[s.key].warm_up(longest, **self.sampling.to_dict())
        if any(s.fast for s in settings):
            self.warm_up_s = time.perf_counter() - start
            print(f"fast path: every decoder's units compiled in {self.warm_up_s:.1f} s")
        seen: set[str] = set()
        for s in settings:
            if s.family not in seen:
                seen.add(s.family)
                self.run_one(s, decoders.get(s.key), 0, max_new_tokens=min(8, self.args.max_new_tokens))


def check_fit_possible(settings: list[Setting], n_prompts: int) -> None:
    """Refuse, before any model is loaded, a grid whose cost fit would fail after all its runs."""
    fitted = [s for s in settings if is_fitted(s.family) or s.fast]
    if n_prompts * len(fitted) < 2:
        raise AccheadError(
            f"the cost fit needs at least 2 runs of {', '.join(FIT_FAMILIES)}; this bench has {n_prompts} "
            f"prompt(s) x {len(fitted)} such setting(s): add prompts (--num-prompts) or --methods"
        )


def run_grid(
    bench: Bench, settings: list[Setting], out: Path, fingerprint: str
) -> dict[str, list[PromptRun]]:
    """Every setting on every prompt, prompt-major, resuming from `out/partial/prompt-*.json`.

    Prompt-major order (all settings on prompt 0, then prompt 1, ...), shuffled per prompt with a seeded
    generator, spreads slow drifts of the machine's load evenly over the methods instead of penalising
    whichever method runs while a neighbour is busy. A prompt's file is rewritten (atomically, fsynced)
    after each of its runs, so a kill loses at most the run in progress.
    """
    from tqdm import tqdm

    from acchead.inference.bench.hf_assisted import HF_METHODS
    from acchead.inference.bench.hf_custom import METHOD as CUSTOM_METHOD

    n = len(bench.prompt_ids)
    # Built before any run, so that a bad spec fails here (hf-custom decodes its twin's spec, built here
    # too, through `generate`, which keeps its own decoder on the target).
    decoders = {s.key: bench.decoder(s) for s in settings if s.family not in (*HF_METHODS, CUSTOM_METHOD)}
    done = [{} if bench.args.fresh else load_partial(partial_path(out, i), fingerprint) for i in range(n)]
    todo = sum(s.key not in done[i] for i in range(n) for s in settings)
    resumed = n * len(settings) - todo
    if resumed:
        print(f"resuming: {resumed} of {n * len(settings)} runs already done in {out / 'partial'}")
    if todo:
        bench.warm_up(settings, decoders)
    with tqdm(total=todo, desc="bench", unit="run", dynamic_ncols=True) as bar:
        for i in range(n):
            order = [s for s in settings if s.key not in done[i]]
            random.Random(bench.args.seed * 100_003 + i).shuffle(order)
            for s in order:
                bar.set_postfix_str(f"prompt {i} {s.label}")
                done[i][s.key] = bench.run_one(s, decoders.get(s.key), i)
                # Saved after every run (outside its timed region): a kill loses one run at most.
                save_partial(partial_path(out, i), fingerprint, done[i])
                bar.update()
    return {s.key: [done[i][s.key] for i in range(n)] for s in settings}


def run_bench(args: argparse.Namespace) -> dict:
    """Load everything, run the grid (resuming from partials), fit, and write the three outputs."""
    from acchead.feature_draft import is_feature_draft
    from acchead.head_io import load_head
    from acchead.inference.bench.hf_assisted import METHOD as HF_METHOD
    from acchead.inference.bench.hf_assisted import schedule_params
    from acchead.inference.bench.report import write_outputs
    from acchead.models import check_tokenizers_match, load_causal_lm, load_tokenizer

    out = Path(args.out)
    prompts = load_prompts(args.prompts, args.num_prompts)
    sampling = SamplingConfig(args.temperature, args.top_k, args.top_p)
    settings, notes = build_settings(args, sampling)
    check_fit_possible(settings, len(prompts))
    target = load_causal_lm(args.target, args.dtype, args.device)
    draft = load_causal_lm(args.draft, args.dtype, args.device)
    if is_feature_draft(draft):  # it drafts from the target's states: our decoders only (either path)
        runs = [s.family != HF_METHOD for s in settings]
        dropped = sorted({s.family for s, ok in zip(settings, runs, strict=True) if not ok})
        settings = [s for s, ok in zip(settings, runs, strict=True) if ok]
        if dropped:
            notes.append(f"skipped with a feature draft (it reads the target's states, which transformers' "
                         f"assisted generation does not hand over): {', '.join(dropped)}")  # fmt: skip
    # the hf-assisted row records the schedule transformers will use with this draft
    settings = [replace(s, params={**s.params, **schedule_params(draft)}) if s.family == HF_METHOD else s
                for s in settings]  # fmt: skip
    tok = load_tokenizer(args.tokenizer or args.target)
    check_tokenizers_match(tok, load_tokenizer(args.tokenizer or args.draft))
    heads = used_heads(args, settings)  # (family, path, kind) of every head a setting decodes with
    head_paths = [path for _, path, _ in heads]
    # Loaded now (checked against the draft before any run) for the per-head overhead timing.
    loaded = {family: load_head(path, draft=draft)[0].to(args.device) for family, path, _ in heads}

    prompt_ids, truncated = encode_prompts(
        prompts, tok, target, draft, args.max_new_tokens, args.device, args.truncate_prompts
    )
    bench = Bench(args, target, draft, tok, prompt_ids, tok.eos_token_id)
    key = run_key(args, prompt_ids, target, draft, head_paths)
    fingerprint = run_fingerprint(args, prompt_ids, target, draft, head_paths)
    identity = run_identity(args, key, settings)
    with locked_run(out, "bench", identity, prog="acchead-bench", overwrite=args.overwrite):
        remove_stale_tmp(out / "partial")  # left by a bench killed mid-write
        if truncated:
            print(f"truncated {len(truncated)} prompt(s) to their last {truncated[0]['kept']} tokens")
        results = _run_and_report(args, bench, settings, out, fingerprint, draft, loaded, notes, sampling)
        batched: list[BatchedRow] = []
        if args.batch_size:  # issue 33: the batchable settings again, B prompts per forward
            from acchead.inference.bench.batched_bench import run_batched, write_batched

            batched = run_batched(bench, settings, args.batch_size)
        results = results | {"truncated_prompts": truncated}
        if args.batch_size:
            results = results | {"batched": [r.to_dict() for r in batched]}
        write_outputs(results, out)
        if batched:
            write_batched(batched, out)
        mark_complete(out, "bench", identity)
    return results


def _run_and_report(
    args: argparse.Namespace,
    bench: Bench,
    settings: list[Setting],
    out: Path,
    fingerprint: str,
    draft: Any,
    heads: dict[str, Any],
    notes: list[str],
    sampling: SamplingConfig,
) -> dict:
    """Run the grid (resuming from partials), fit the costs, time each head (`heads`: loaded head by
    family), and build the results object."""
    from acchead.inference.bench.costmodel import aggregate
    from acchead.inference.bench.head_timing import time_head_overhead
    from acchead.inference.bench.report import build_results
    from acchead.inference.bench.rows import MeasuredRow

    prompt_ids = bench.prompt_ids
    done = run_grid(bench, settings, out, fingerprint)

    fits = path_fits(settings, done)
    fit = base_fit(fits)
    overhead = {
        family: time_head_overhead(draft, head, prompt_ids[0], calls=args.overhead_calls, sampling=sampling)
        for family, head in heads.items()
    } or None
    loop = _profile_loops(args, bench, settings, sampling)
    rows = [
        MeasuredRow(
            method=s.family,
            params=s.params,
            spec=s.spec,
            metrics=aggregate([r.counts() for r in done[s.key]], fits["fast"] if s.fast else fit),
            outputs=tuple(r.output_sha for r in done[s.key]),
        )
        for s in settings
    ]
    # warm_up_s: None when resumed past it or without fast-path settings
    return build_results(args, rows, fit, overhead, notes, sampling, len(prompt_ids), fits) | {
        "loop_profile": loop, "warm_up_s": bench.warm_up_s,
    }  # fmt: skip


def _profile_loops(
    args: argparse.Namespace, bench: Bench, settings: list[Setting], sampling: SamplingConfig
) -> list[dict[str, Any]]:
    """The decoding loop's profile (`acchead.inference.bench.loop_profile`) over the first
    `loop_profile_prompts` prompts, for a fixed-K and a SpecDec++ setting per path; [] when off."""
    from acchead.inference.bench.loop_profile import pick_settings, profile_loop

    n = min(args.loop_profile_prompts, len(bench.prompt_ids))
    if n == 0:
        return []
    prompts = [ids[0] for ids in bench.prompt_ids[:n]]
    longest = max(p.numel() for p in prompts) + args.max_new_tokens
    out = []
    for s in pick_settings(settings):
        decoder = bench.decoder(s)
        decoder.warm_up(longest, **sampling.to_dict())
        out.append(profile_loop(decoder, prompts, args.max_new_tokens, sampling, seed=args.seed).to_dict())
    return out


def path_fits(settings: list[Setting], done: dict[str, list[PromptRun]]) -> dict[str, CostFit | None]:
    """t_draft, t_target fitted apart per way of running the models: our eager decoders, our fast-path
    decoders, and Hugging Face's `generate` + assisted generation (their forwards counted by hooks).
    None where fewer than 2 runs (or no forward) are available."""
    from acchead.inference.bench.costmodel import fit_costs
    from acchead.inference.bench.hf_assisted import HF_METHODS

    groups = {
        "eager": [s for s in settings if is_fitted(s.family)],
        "fast": [s for s in settings if s.fast],
        "hf": [s for s in settings if s.family in HF_METHODS],
    }
    fits: dict[str, CostFit | None] = {}
    for name, group in groups.items():
        runs = [r.counts() for s in group for r in done[s.key]]
        try:
            fits[name] = fit_costs([r.draft_calls for r in runs], [r.target_calls for r in runs],
                                   [r.wall_time for r in runs])  # fmt: skip
        except AccheadError:
            fits[name] = None
    return fits


def base_fit(fits: dict[str, CostFit | None]) -> CostFit:
    """The fit that prices every row but the fast path's: the eager decoders', else (a `--paths fast`
    bench) the fast path's; one line when neither could be fitted."""
    fit = fits.get("eager") or fits.get("fast")
    if fit is None:
        raise AccheadError(f"the cost fit needs runs of at least one of {', '.join(FIT_FAMILIES)}")
    return fit


@cli_errors
def main(argv: list[str] | None = None) -> int:
    args = resolve_args(build_parser().parse_args(argv))
    if args.threads > 0:
        import torch

        torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    # transformers' per-call deprecation notes and weight-loading bars would drown the bench's own bar.
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    results = run_bench(args)
    out = Path(args.out)
    print(f"wrote {out / 'results.json'}, {out / 'pareto.png'}, {out / 'report.md'}")
    for line in results["summary"]:
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
