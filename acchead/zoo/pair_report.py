"""The pair report (`acchead-build-zoo --stage report`): how well the draft agrees with its target, what the
pair costs per step, and what it was trained on, in `<out-dir>/pair_report.json`."""

from __future__ import annotations

import json
import platform
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from acchead.rundir import atomic_write_json
from acchead.step_cost import decode_step_ms
from acchead.zoo.arch import count_step_ops
from acchead.zoo.heldout import evaluate, token_bytes
from acchead.zoo.pairs import PairSpec

if TYPE_CHECKING:
    import numpy as np
    import torch


def op_counts(draft: torch.nn.Module, target: torch.nn.Module) -> dict:
    """Operators one eager one-token forward dispatches (`arch.count_step_ops`), for both, and their ratio."""
    d, t = count_step_ops(draft.config), count_step_ops(target.config)
    return {"draft": asdict(d), "target": asdict(t), "ratio": round(d.dispatched / t.dispatched, 4),
            "context": 128}


def pair_report(pair: PairSpec, args, heldout_ids: np.ndarray, corpus: dict) -> dict:
    """Draft/target agreement before and after distillation, on held-out stdlib functions and HumanEval.

    For each prompt set, the target continues the first `--report-prompts` prompts greedily and at
    temperature 1 (`distill.generate_windows`); both drafts are scored on those very windows
    (`distill.window_agreement`), plus their held-out corpus loss and decode-step cost. The report also
    records the corpus (`training_corpus.tokenize_corpus`'s per-source version, files, bytes and tokens)
    and the pair's operator counts. Run on the CPU: the decode-step times are CPU figures.
    """
    import torch

    from acchead.models import load_causal_lm, load_tokenizer
    from acchead.prompt_sets import load_prompt_set
    from acchead.zoo.distill import generate_windows, window_agreement

    target = load_causal_lm(args.out_dir / pair.target.name)
    tok = load_tokenizer(args.out_dir / pair.target.name)
    drafts = {"before": Path(args.baseline_draft), "after": args.out_dir / pair.distilled_draft.name}
    models = {name: load_causal_lm(path) for name, path in drafts.items()}
    report: dict = {"pair": pair.name, "drafts": {k: str(v) for k, v in drafts.items()}, "prompt_sets": {}}
    for name in ("stdlib-heldout-functions", "humaneval"):
        prompts = [tok(p)["input_ids"] for p in load_prompt_set(name, limit=args.report_prompts)]
        kw = {"context": 128, "new_tokens": 96, "pad_id": tok.eos_token_id, "k": 1, "batch_size": 32}
        greedy = generate_windows(target, prompts, desc=f"{name} greedy", **kw)
        sampled = generate_windows(target, prompts, temperature=1.0, seed=args.seed, desc=f"{name} T=1", **kw)
        report["prompt_sets"][name] = {
            "prompts": len(prompts),
            **{k: {m: round(v, 4) for m, v in window_agreement(d, target, greedy, sampled).items()}
               for k, d in models.items()},
        }
    per_byte = token_bytes(tok)
    for k, d in models.items():
        report[k] = {"heldout": {m: round(v, 4) for m, v in evaluate(d, heldout_ids, args.seq_len,
                                                                      args.eval_tokens, per_byte).items()},
                     "decode_step_ms": round(decode_step_ms(d), 3)}
    report["target"] = {"heldout": {m: round(v, 4) for m, v in evaluate(target, heldout_ids, args.seq_len,
                                                                         args.eval_tokens, per_byte).items()},
                        "decode_step_ms": round(decode_step_ms(target), 3),
                        "parameters": sum(p.numel() for p in target.parameters())}
    report["op_counts"] = op_counts(models["after"], target)
    report["corpus"] = corpus
    threads = torch.get_num_threads()
    report["machine"] = f"{platform.machine()}, {threads} CPU threads, torch {torch.__version__}"
    atomic_write_json(args.out_dir / "pair_report.json", report, sort_keys=False)
    print(json.dumps(report, indent=2))
    return report
