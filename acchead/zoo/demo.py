"""A first look at the embedded demo pair: sizes, held-out figures, and a greedy completion.

    python -m acchead.zoo.demo                    # HumanEval/0, 96 new tokens
    python -m acchead.zoo.demo --prompt-index 12 --max-new-tokens 64

Loads pycode-target and pycode-draft, checks that they share one tokenizer, prints their parameter
counts and the held-out loss/accuracy from their training reports, then lets the target complete a
HumanEval prompt greedily with `generate` and reports how many of those tokens the draft would have
proposed itself (its greedy agreement: the quantity speculative decoding turns into speed).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from acchead.errors import AccheadError, cli_errors
from acchead.models import check_tokenizers_match, load_causal_lm, load_tokenizer
from acchead.prompt_sets import load_prompt_set
from acchead.zoo import DRAFT_DIR, TARGET_DIR


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m acchead.zoo.demo",
        description="Load the embedded demo pair and let the target complete a HumanEval prompt.",
    )
    p.add_argument("--target", type=Path, default=TARGET_DIR, help="target model dir (default: the zoo's)")
    p.add_argument("--draft", type=Path, default=DRAFT_DIR, help="draft model dir (default: the zoo's)")
    p.add_argument("--prompt-index", type=int, default=0, help="which HumanEval prompt, 0-163 (default: 0)")
    p.add_argument("--max-new-tokens", type=int, default=96, help="tokens the target generates (default: 96)")
    return p


def _report(model_dir: Path) -> str:
    """`held-out loss 3.19, accuracy 41.0% (N tokens)` from the builder's training_report.json."""
    path = model_dir / "training_report.json"
    if not path.is_file():
        return "no training_report.json"
    r = json.loads(path.read_text())
    return (
        f"held-out loss {r['heldout_loss']:.3f}, accuracy {100 * r['heldout_accuracy']:.1f}% "
        f"({r['heldout_eval_tokens']:,} tokens); trained {r['train_minutes']:.0f} min on "
        f"{r['train_tokens']:,} tokens ({r['machine']})"
    )


@torch.no_grad()
def draft_agreement(draft, ids: torch.Tensor, prompt_len: int) -> float:
    """Share of the tokens after `prompt_len` in ids (1, T) that are the draft's greedy choice."""
    logits = draft(ids).logits[0, prompt_len - 1 : -1]  # (T - prompt_len, vocab): predicts ids[prompt_len:]
    return (logits.argmax(-1) == ids[0, prompt_len:]).float().mean().item()


@cli_errors
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for d in (args.target, args.draft):
        if not (d / "config.json").is_file():
            raise AccheadError(f"demo model not built yet: {d} (build the pair with `acchead-build-zoo`)")
    if args.max_new_tokens < 1:
        raise AccheadError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    prompts = load_prompt_set("humaneval")
    if not 0 <= args.prompt_index < len(prompts):
        raise AccheadError(f"--prompt-index must be in 0..{len(prompts) - 1}, got {args.prompt_index}")

    tok = load_tokenizer(args.target)
    check_tokenizers_match(tok, load_tokenizer(args.draft))
    target, draft = load_causal_lm(args.target), load_causal_lm(args.draft)
    for name, model, d in (("target", target, args.target), ("draft", draft, args.draft)):
        n = sum(p.numel() for p in model.parameters())
        print(f"{name:6s} {d.name}: {n / 1e6:.2f}M parameters; {_report(d)}")

    prompt = prompts[args.prompt_index]
    ids = tok(prompt, return_tensors="pt").input_ids
    start = time.perf_counter()
    out = target.generate(
        ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=args.max_new_tokens,
        pad_token_id=tok.eos_token_id,
    )
    seconds = time.perf_counter() - start
    new = out.shape[1] - ids.shape[1]
    print(f"\n--- HumanEval/{args.prompt_index}, target greedy, {new} tokens in {seconds:.2f} s "
          f"({new / seconds:.0f} tok/s) ---")
    print(prompt + tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True))
    print(f"--- the draft's greedy choice matches {100 * draft_agreement(draft, out, ids.shape[1]):.0f}% "
          "of these target tokens ---")
    return 0


if __name__ == "__main__":
    sys.exit(main())
