"""Build the embedded demo pair: a byte-level BPE tokenizer and two Llama LMs trained on Python source.

    acchead-build-zoo                      # pair v2: tokenizer, target, distilled draft, report (resumable)
    acchead-build-zoo --stage arch         # the candidate target shapes and their operator counts
    acchead-build-zoo --stage target       # one stage only
    acchead-build-zoo --pair v1            # the pair shipped before issue 21, exactly as it was built
    acchead-build-zoo --stage draft --draft-recipe corpus   # the draft shipped before distillation
    acchead-build-zoo --stage report       # agreement before/after distillation -> pair_report.json

Pairs (`PAIRS`): v1 is a 6 x 256 target and a 2 x 128 draft trained on the stdlib (CPU-sized budgets); v2
(the default, issue 21) a deep, narrow target of the same parameter count (`acchead.zoo.arch` picked its
shape by operator counts) and the same 2 x 128 draft, trained on the stdlib plus the source of a fixed
list of installed packages (`acchead.zoo.training_corpus`), with budgets sized for one H100 (each stage
about ten minutes). Both share the tokenizer (trained on the stdlib LM-train files; v2 keeps it because it
encodes the held-out files in 6% fewer tokens than one trained on the v2 corpus, docs/pair.md) and the
40 held-out stdlib files.

The target trains on the corpus (next-token loss). The shipped draft is distilled from the target
(`acchead.zoo.distill`): forward KL to the target's cached top-k distribution over the same corpus,
starting from the corpus draft.

Each stage checkpoints to `--work-dir` every few minutes (atomic writes), so a killed run continues where it
stopped. Training ends at a token budget or a wall-clock budget, whichever comes first; the learning-rate
schedule (linear warm-up, cosine decay) follows the fraction of that budget used, so a time-limited run
still anneals. On a CPU, give v2 a longer clock (`--minutes`) and fewer tokens (`--budget-scale`): the run
says what it reached (`train_tokens`, `stopped_by` in its training_report.json). The exported models are
stored in float16 to keep the pair small; load them in float32.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from acchead.errors import AccheadError, cli_errors, int_at_least, thread_count
from acchead.zoo import ZOO_DIR
from acchead.zoo.arch import add_arch_arguments, run_arch
from acchead.zoo.lm_training import batch_size_for, lm_sampler, train_lm
from acchead.zoo.pairs import DEFAULT_PAIR, PAIRS, LMSpec, PairSpec
from acchead.zoo.training_corpus import CORPORA, heldout_source, source_texts, tokenize_corpus, train_sources

# numpy, torch, tqdm and `acchead.zoo.distill` (which needs them) load where they are used: `--help` and
# bad flags must not wait seconds for torch.
if TYPE_CHECKING:
    import numpy as np
    import torch

    from acchead.zoo.lm_training import Batch, Sampler

EOS = "<|endoftext|>"


def tokenizer_dir(work: Path, corpus: str) -> Path:
    """Where the BPE trained on `corpus` lives: `tokenizer/` for the stdlib (v1's layout), else a sibling."""
    return work / ("tokenizer" if corpus == "stdlib" else f"tokenizer-{corpus}")


def train_tokenizer(work: Path, vocab_size: int, corpus: str = "stdlib") -> Path:
    """Train the byte-level BPE on `corpus`'s LM-train files; returns the directory holding the HF tokenizer.

    On the stdlib it reproduces the shipped tokenizer byte for byte (checked 2026-11-24, 5 s).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    out = tokenizer_dir(work, corpus)
    if (out / "tokenizer.json").exists():
        return out
    sources = train_sources(corpus)
    texts = list(source_texts(sources))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOS, eos_token=EOS, pad_token=EOS)
    hf.model_max_length = 1024
    tmp = out.with_name(out.name + ".tmp")  # written whole, then renamed: `out` exists only when complete
    shutil.rmtree(tmp, ignore_errors=True)
    hf.save_pretrained(tmp)
    os.replace(tmp, out)
    return out


def kd_corpus(train_ids: np.ndarray, seq_len: int, windows: int | None) -> tuple[np.ndarray, str]:
    """(the ids the teacher is cached over, the cache directory's suffix): all of `train_ids`, or `windows`
    of its `seq_len`-token windows, evenly spaced so that every source of the corpus is represented."""
    import numpy as np

    n = len(train_ids) // seq_len
    if windows is None or windows >= n:
        return train_ids, ""
    starts = np.linspace(0, n - 1, windows).round().astype(np.int64) * seq_len
    return np.concatenate([train_ids[s : s + seq_len] for s in starts]), f"-w{windows}"


def distill_draft(
    pair: PairSpec, tok_dir: Path, train_ids: np.ndarray, heldout_ids: np.ndarray, args, init_dir: Path | None
) -> dict:
    """Train the pair's draft on its target's cached top-k distributions (see `acchead.zoo.distill`)."""
    import torch

    from acchead.models import load_causal_lm
    from acchead.zoo.distill import build_teacher_cache, kd_loss, sample_kd_batch, teacher_forced_agreement

    device = torch.device(args.device)
    target = load_causal_lm(args.out_dir / pair.target.name, device=str(device))
    # v2's full cache: 50.8M tokens x top-32 x (uint16 id + float16 log-prob) = 6.5 GB, and hours of the
    # target's forward on a CPU (v1's: 333 MB, 14 min); `--teacher-windows` caches evenly spaced windows.
    corpus, cache_dir = kd_corpus(train_ids, args.seq_len, args.teacher_windows)
    t0 = time.time()
    # The teacher's forward follows the training precision: bf16 on a GPU and on CPUs with native bf16 (1.3x
    # faster than fp32 for the 21 x 160 target there), fp32 elsewhere (bf16 ran 5x slower; docs/pair.md).
    cache = build_teacher_cache(target, corpus, args.seq_len, args.teacher_topk,
                                args.work_dir / f"teacher-top{args.teacher_topk}{cache_dir}",
                                bf16=args.bf16, batch_size=64 if device.type == "cuda" else 8)
    teacher_minutes = (time.time() - t0) / 60
    batch_size = batch_size_for(pair.distilled_draft, args)

    def sampler(gen: torch.Generator) -> Batch:
        return sample_kd_batch(cache, corpus, batch_size, gen)

    def probe(model: torch.nn.Module) -> dict[str, float]:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=False):
            m = teacher_forced_agreement(model, target, heldout_ids, args.seq_len, args.probe_tokens)
        return {k: round(v, 4) for k, v in m.items() if k != "tokens"}

    extra = {
        "recipe": "distill",
        "pair": pair.name,
        "teacher": pair.target.name,
        "teacher_topk": args.teacher_topk,
        "teacher_cache_minutes_this_run": round(teacher_minutes, 2),
        "teacher_windows": cache.num_windows,
        "teacher_windows_of_corpus": len(train_ids) // args.seq_len,
    }
    return train_lm(pair.distilled_draft, tok_dir, heldout_ids, args, sampler, kd_loss, init_dir, probe,
                    extra, run_name="pycode-draft-distill")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


_positive_int = int_at_least(1)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="acchead-build-zoo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pair", choices=sorted(PAIRS), default=DEFAULT_PAIR,
                   help="which pair to build: v2 (default, issue 21: deep-narrow target, stdlib + packages "
                        "corpus, H100-sized budgets) or v1 (the pair shipped before it, reproduced exactly: "
                        "6 x 256 target, stdlib corpus, CPU-sized budgets)")
    stages = ["all", "arch", "tokenizer", "draft", "target", "report"]
    p.add_argument("--stage", default="all", choices=stages,
                   help="which part to build (default: all = tokenizer, target, draft, report; the distilled "
                        "draft needs the target in --out-dir); arch: print the candidate target shapes with "
                        "their operator counts and the pick (builds nothing)")
    p.add_argument("--draft-recipe", choices=["distill", "corpus"], default="distill",
                   help="distill: train the draft on the target's top-k distributions (the shipped draft); "
                        "corpus: next-token loss on the corpus alone (the draft shipped before 0.2)")
    p.add_argument("--distill-init", default="corpus",
                   help="distilled draft's starting weights: 'corpus' (train the corpus draft into "
                        "--work-dir first), 'scratch', or a model directory (default: corpus)")
    p.add_argument("--teacher-topk", type=_positive_int, default=32,
                   help="teacher ids kept per position in the distillation cache (default: 32)")
    p.add_argument("--teacher-windows", type=_positive_int, default=None,
                   help="cache the teacher on this many evenly spaced windows of --seq-len tokens, not the "
                        "whole corpus (default: all; v2's 99k windows are 6.5 GB and hours of the target "
                        "on a CPU: e.g. 4000 there)")
    p.add_argument("--baseline-draft", default=None,
                   help="report stage: the draft to compare against (default: the corpus draft in "
                        "--work-dir/corpus)")
    p.add_argument("--report-prompts", type=_positive_int, default=64,
                   help="report stage: prompts of each set the target continues (default: 64)")
    p.add_argument("--probe-tokens", type=_positive_int, default=16_384,
                   help="held-out tokens on which draft/target agreement is logged at each checkpoint")
    p.add_argument("--out-dir", type=Path, default=ZOO_DIR,
                   help="where pycode-draft/ and pycode-target/ go (default: the package's zoo, replacing "
                        "the shipped pair)")
    p.add_argument("--work-dir", type=Path, default=None,
                   help="tokenized corpus and resumable checkpoints (default: work/zoo for v1, "
                        "work/zoo-v2 for v2)")
    p.add_argument("--tokenizer-corpus", choices=CORPORA, default=None,
                   help="corpus the BPE is trained on (default: the pair's, stdlib for both; "
                        "stdlib+packages trains another into --work-dir, to measure)")
    p.add_argument("--vocab-size", type=_positive_int, default=4096,
                   help="BPE vocabulary size (default: 4096)")
    p.add_argument("--seq-len", type=_positive_int, default=512,
                   help="training window in tokens (default: 512)")
    p.add_argument("--batch-size", type=_positive_int, default=None,
                   help="windows per optimiser step (default: the spec's: 16 for v1, 64 for v2)")
    p.add_argument("--budget-scale", type=_positive_float, default=1.0,
                   help="multiply every model's token budget, and its time budget unless --minutes is "
                        "given (0.01 for a smoke run)")
    p.add_argument("--minutes", type=_positive_float, default=None,
                   help="wall-clock budget of each training stage, replacing the spec's (v2's are sized for "
                        "one H100: on a CPU give it hours, e.g. --minutes 240 --budget-scale 0.1)")
    p.add_argument("--eval-tokens", type=_positive_int, default=150_000,
                   help="held-out tokens to evaluate on (default: 150000)")
    p.add_argument("--ckpt-minutes", type=float, default=3.0, help="minutes between checkpoints (default: 3)")
    p.add_argument("--device", default="auto",
                   help="where to train: auto (cuda if available, else cpu), cpu, cuda or cuda:N")
    p.add_argument("--threads", type=thread_count, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                   help="bf16 autocast for training steps (default: on for cuda, and on a CPU with native "
                        "bf16 (avx512_bf16/amx_bf16): 2.5x faster there, but 4-6x SLOWER than fp32 on a CPU "
                        "without it (both measured))")
    p.add_argument("--seed", type=int, default=0, help="seed for init and batch sampling")
    add_arch_arguments(p.add_argument_group("--stage arch: the candidate target shapes"))
    return p


def resolve_device(name: str) -> str:
    """`--device` as a torch device string; a one-line error if CUDA is asked for and absent."""
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return name
    if name == "cuda" or name.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise AccheadError(f"--device {name}: torch sees no CUDA device here (torch {torch.__version__})")
        return name
    raise AccheadError(f"--device must be auto, cpu, cuda or cuda:N, got {name!r}")


@cli_errors
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    pair = PAIRS[args.pair]
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if args.stage == "arch":
        run_arch(args, pair.draft.shape(), PAIRS["v1"].target.shape())
        return 0
    args.device = resolve_device(args.device)
    if args.bf16 is None:
        import torch

        from acchead.models import native_bfloat16

        args.bf16 = native_bfloat16(torch.device(args.device))
    args.work_dir = args.work_dir or pair.work_dir
    args.work_dir.mkdir(parents=True, exist_ok=True)
    tok_dir = train_tokenizer(args.work_dir, args.vocab_size, args.tokenizer_corpus or pair.tokenizer_corpus)
    if args.stage == "tokenizer":
        return 0
    train_ids, heldout_ids, corpus = tokenize_corpus(args.work_dir, tok_dir, train_sources(pair.corpus),
                                                     heldout_source())
    print(f"pair {pair.name}, corpus {pair.corpus}: {len(train_ids):,} train tokens, {len(heldout_ids):,} "
          f"held-out tokens; device {args.device}, bf16 {args.bf16}", file=sys.stderr)

    def corpus_sampler(spec: LMSpec) -> Sampler:
        return lm_sampler(train_ids, batch_size_for(spec, args), args.seq_len)

    if args.stage in ("all", "target"):
        train_lm(pair.target, tok_dir, heldout_ids, args, corpus_sampler(pair.target))
    if args.stage in ("all", "draft"):
        if args.draft_recipe == "corpus":
            train_lm(pair.draft, tok_dir, heldout_ids, args, corpus_sampler(pair.draft))
            return 0
        if not (args.out_dir / pair.target.name / "config.json").exists():
            raise AccheadError(f"the distilled draft needs the target: no {args.out_dir / pair.target.name}; "
                               "build it first (--stage target)")
        init: Path | None
        if args.distill_init == "scratch":
            init = None
        elif args.distill_init == "corpus":
            init = args.work_dir / "corpus" / pair.draft.name
            if not (init / "config.json").exists():
                corpus_args = argparse.Namespace(**{**vars(args), "out_dir": args.work_dir / "corpus"})
                train_lm(pair.draft, tok_dir, heldout_ids, corpus_args, corpus_sampler(pair.draft))
        else:
            init = Path(args.distill_init)
            if not (init / "config.json").exists():
                raise AccheadError(f"--distill-init {init}: not a model directory (no config.json)")
        distill_draft(pair, tok_dir, train_ids, heldout_ids, args, init)
    if args.stage in ("all", "report"):
        args.baseline_draft = args.baseline_draft or str(args.work_dir / "corpus" / pair.draft.name)
        from acchead.zoo.pair_report import pair_report

        pair_report(pair, args, heldout_ids, corpus)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
