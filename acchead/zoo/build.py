"""Build the embedded demo pair: a byte-level BPE tokenizer and two Llama LMs trained on stdlib source.

    acchead-build-zoo                      # tokenizer, target, distilled draft, report (resumable)
    acchead-build-zoo --stage target       # one stage only
    acchead-build-zoo --stage draft --draft-recipe corpus   # the draft shipped before distillation
    acchead-build-zoo --stage report       # agreement before/after distillation -> pair_report.json

The target trains on the corpus (next-token loss). The shipped draft, same size as the corpus draft, is
distilled from the target (`acchead.zoo.distill`): forward KL to the target's cached top-k distribution
over the same corpus, starting from the corpus draft.

Each stage checkpoints to `--work-dir` every few minutes (atomic writes), so a killed run continues where it
stopped. Training ends at a token budget or a wall-clock budget, whichever comes first; the learning-rate
schedule (linear warm-up, cosine decay) follows the fraction of that budget used, so a time-limited run
still anneals. The exported models are stored in float16 to keep the pair small; load them in float32.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from acchead.errors import AccheadError, cli_errors
from acchead.rundir import atomic_write_json
from acchead.zoo import ZOO_DIR
from acchead.zoo.corpus import read_source, split_files

# numpy, torch, tqdm and `acchead.zoo.distill` (which needs them) load where they are used: `--help` and
# bad flags must not wait seconds for torch.
if TYPE_CHECKING:
    import numpy as np
    import torch

    Batch = tuple[torch.Tensor, ...]
    Sampler = Callable[[torch.Generator], Batch]  # draws one training batch
    Objective = Callable[[torch.nn.Module, Batch], torch.Tensor]  # scalar loss of a batch

EOS = "<|endoftext|>"


@dataclass
class LMSpec:
    """Architecture and training budget of one demo LM."""

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    peak_lr: float
    token_budget: int  # stop after this many training tokens ...
    minutes: float  # ... or after this many minutes, whichever first


DRAFT = LMSpec("pycode-draft", 128, 2, 2, 768, 2e-3, 4_000_000, 6.0)
TARGET = LMSpec("pycode-target", 256, 6, 4, 1024, 1e-3, 9_000_000, 38.0)
# The shipped draft: DRAFT's architecture, distilled from TARGET (starting from DRAFT's corpus weights).
DISTILLED_DRAFT = LMSpec("pycode-draft", 128, 2, 2, 768, 1e-3, 60_000_000, 45.0)


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 natively (Linux /proc/cpuinfo flags); elsewhere False (plain fp32)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def atomic_save(obj: object, path: Path) -> None:
    import torch

    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def train_tokenizer(work: Path, vocab_size: int) -> Path:
    """Train the byte-level BPE on the LM-train files; returns the directory holding the HF tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    out = work / "tokenizer"
    if (out / "tokenizer.json").exists():
        return out
    train_files, _ = split_files()
    texts = [t for f in train_files if (t := read_source(f)) is not None]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOS, eos_token=EOS, pad_token=EOS)
    hf.model_max_length = 1024
    hf.save_pretrained(out)
    return out


def tokenize_corpus(work: Path, tok_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """(train ids, held-out ids) as uint16 arrays; files are joined with EOS."""
    import numpy as np
    from tqdm import tqdm
    from transformers import AutoTokenizer

    paths = {"train": work / "train_ids.npy", "heldout": work / "heldout_ids.npy"}
    if all(p.exists() for p in paths.values()):
        return np.load(paths["train"]), np.load(paths["heldout"])
    tok = AutoTokenizer.from_pretrained(tok_dir)
    for split, files in zip(paths, split_files(), strict=True):
        ids: list[int] = []
        for f in tqdm(files, desc=f"tokenize {split}", unit="file"):
            text = read_source(f)
            if text is not None:
                ids.extend(tok(text)["input_ids"])
                ids.append(tok.eos_token_id)
        arr = np.asarray(ids, dtype=np.uint16)
        tmp = paths[split].with_suffix(".tmp.npy")
        np.save(tmp, arr)
        os.replace(tmp, paths[split])
    return np.load(paths["train"]), np.load(paths["heldout"])


def make_model(spec: LMSpec, tok, seq_len: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_heads,
        max_position_embeddings=2 * seq_len,
        tie_word_embeddings=True,
        bos_token_id=tok.eos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.eos_token_id,
    )
    return LlamaForCausalLM(cfg)


def evaluate(model, ids: np.ndarray, seq_len: int, max_tokens: int) -> dict[str, float]:
    """Mean next-token loss and top-1 accuracy over non-overlapping windows of held-out ids."""
    import numpy as np
    import torch

    model.eval()
    n = min(len(ids) // (seq_len + 1), max(1, max_tokens // seq_len))
    tot_loss, tot_correct, tot = 0.0, 0, 0
    with torch.no_grad():
        for i in range(n):
            w = torch.from_numpy(ids[i * (seq_len + 1) : (i + 1) * (seq_len + 1)].astype(np.int64))[None]
            logits = model(w[:, :-1]).logits[0]  # (seq_len, vocab)
            tgt = w[0, 1:]
            tot_loss += torch.nn.functional.cross_entropy(logits, tgt, reduction="sum").item()
            tot_correct += (logits.argmax(-1) == tgt).sum().item()
            tot += tgt.numel()
    model.train()
    return {"loss": tot_loss / tot, "accuracy": tot_correct / tot, "tokens": tot}


def lr_at(progress: float, peak: float, warmup: float = 0.03) -> float:
    if progress < warmup:
        return peak * progress / warmup
    p = min(1.0, (progress - warmup) / (1 - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


def lm_sampler(train_ids: np.ndarray, batch_size: int, seq_len: int) -> Sampler:
    """Random windows of the corpus, for next-token cross-entropy."""
    import numpy as np
    import torch

    data = torch.from_numpy(train_ids.astype(np.int64))

    def sample(gen: torch.Generator) -> Batch:
        starts = torch.randint(0, len(data) - seq_len - 1, (batch_size,), generator=gen)
        return (torch.stack([data[s : s + seq_len] for s in starts.tolist()]),)  # (B, T)

    return sample


def lm_loss(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    return model(batch[0], labels=batch[0]).loss


def train_lm(
    spec: LMSpec,
    tok_dir: Path,
    heldout_ids: np.ndarray,
    args,
    sampler: Sampler,
    objective: Objective = lm_loss,
    init_dir: Path | None = None,
    probe: Callable[[torch.nn.Module], dict[str, float]] | None = None,
    extra_report: dict | None = None,
    run_name: str | None = None,
) -> dict:
    """Train one LM (from scratch, or from `init_dir`) until its token or time budget; export it.

    `probe(model)` is called at every checkpoint and at the end; its figures go into the report's
    `curve`, so a run shows how a metric moved with training tokens.
    """
    import torch
    from tqdm import tqdm
    from transformers import AutoTokenizer, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(tok_dir)
    torch.manual_seed(args.seed)
    if init_dir is not None:
        model = LlamaForCausalLM.from_pretrained(init_dir, dtype=torch.float32)
    else:
        model = make_model(spec, tok, args.seq_len)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=spec.peak_lr, betas=(0.9, 0.95), weight_decay=0.1)
    ckpt = args.work_dir / f"{run_name or spec.name}.ckpt.pt"
    state: dict = {"step": 0, "tokens": 0, "elapsed": 0.0, "curve": []}
    gen = torch.Generator().manual_seed(args.seed)
    if ckpt.exists():
        saved = torch.load(ckpt, weights_only=False)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        gen.set_state(saved["gen"])
        state = {"curve": [], **saved["state"]}
        print(f"[{spec.name}] resumed at step {state['step']} ({state['tokens']:,} tokens)")
    budget_tokens = int(spec.token_budget * args.budget_scale)
    budget_s = spec.minutes * 60 * args.budget_scale
    tokens_per_step = args.batch_size * args.seq_len

    def checkpoint() -> None:
        state["elapsed"] = time.time() - t_start
        if probe is not None:
            state["curve"].append({"tokens": state["tokens"], "minutes": round(state["elapsed"] / 60, 2),
                                   **probe(model)})
            tqdm.write(f"[{spec.name}] {json.dumps(state['curve'][-1])}")
        atomic_save({"model": model.state_dict(), "opt": opt.state_dict(), "gen": gen.get_state(),
                     "state": state}, ckpt)

    t_start, last_ckpt = time.time() - state["elapsed"], time.time()
    bar = tqdm(total=budget_tokens, initial=state["tokens"], unit="tok", unit_scale=True, desc=spec.name)
    while True:
        elapsed = time.time() - t_start
        progress = max(state["tokens"] / budget_tokens, elapsed / budget_s)
        if progress >= 1.0:
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(progress, spec.peak_lr)
        batch = sampler(gen)
        # bf16 autocast keeps fp32 master weights; on CPUs with avx512_bf16 it is ~2.5x faster (measured).
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            loss = objective(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        state["step"] += 1
        state["tokens"] += tokens_per_step
        bar.update(tokens_per_step)
        bar.set_postfix(loss=f"{loss.item():.3f}", lr=f"{opt.param_groups[0]['lr']:.1e}")
        if time.time() - last_ckpt > args.ckpt_minutes * 60:
            checkpoint()
            last_ckpt = time.time()
    bar.close()
    if probe is not None and (not state["curve"] or state["curve"][-1]["tokens"] != state["tokens"]):
        checkpoint()
    state["elapsed"] = time.time() - t_start
    model.eval()
    metrics = evaluate(model, heldout_ids, args.seq_len, args.eval_tokens)
    out_dir = args.out_dir / spec.name
    out_dir.mkdir(parents=True, exist_ok=True)
    model.to(torch.float16).save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(tok_dir).save_pretrained(out_dir)
    report = {
        "model": spec.name,
        "spec": asdict(spec),
        "budget_scale": args.budget_scale,
        "init": None if init_dir is None else Path(init_dir).name,
        "parameters": sum(p.numel() for p in model.parameters()),
        "train_tokens": state["tokens"],
        "train_steps": state["step"],
        "train_minutes": round(state["elapsed"] / 60, 2),
        "heldout_loss": round(metrics["loss"], 4),
        "heldout_accuracy": round(metrics["accuracy"], 4),
        "heldout_eval_tokens": metrics["tokens"],
        "seq_len": args.seq_len,
        "batch_size": args.batch_size,
        "machine": f"{platform.machine()}, {torch.get_num_threads()} CPU threads, torch {torch.__version__}",
        "python": platform.python_version(),
        **(extra_report or {}),
        "curve": state["curve"],
    }
    atomic_write_json(out_dir / "training_report.json", report, sort_keys=False)
    print(json.dumps({k: v for k, v in report.items() if k != "curve"}, indent=2))
    return report


def distill_draft(
    tok_dir: Path, train_ids: np.ndarray, heldout_ids: np.ndarray, args, init_dir: Path | None
) -> dict:
    """Train the draft on the target's cached top-k distributions (see `acchead.zoo.distill`)."""
    import torch

    from acchead.models import load_causal_lm
    from acchead.zoo.distill import build_teacher_cache, kd_loss, sample_kd_batch, teacher_forced_agreement

    target = load_causal_lm(args.out_dir / TARGET.name)
    t0 = time.time()
    cache = build_teacher_cache(target, train_ids, args.seq_len, args.teacher_topk,
                                args.work_dir / f"teacher-top{args.teacher_topk}")
    teacher_minutes = (time.time() - t0) / 60

    def sampler(gen: torch.Generator) -> Batch:
        return sample_kd_batch(cache, train_ids, args.batch_size, gen)

    def probe(model: torch.nn.Module) -> dict[str, float]:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False):
            m = teacher_forced_agreement(model, target, heldout_ids, args.seq_len, args.probe_tokens)
        return {k: round(v, 4) for k, v in m.items() if k != "tokens"}

    extra = {
        "recipe": "distill",
        "teacher": TARGET.name,
        "teacher_topk": args.teacher_topk,
        "teacher_cache_minutes_this_run": round(teacher_minutes, 2),
        "teacher_windows": cache.num_windows,
    }
    return train_lm(DISTILLED_DRAFT, tok_dir, heldout_ids, args, sampler, kd_loss, init_dir, probe, extra,
                    run_name="pycode-draft-distill")


def decode_step_ms(model: torch.nn.Module, context: int = 256, calls: int = 100) -> float:
    """Median ms of a one-token KV-cached forward at `context` tokens (the cache cropped back after each)."""
    import torch
    from transformers import DynamicCache

    times = []
    with torch.inference_mode():
        cache = DynamicCache()
        x = torch.randint(1, model.config.vocab_size, (1, context))
        model(input_ids=x, past_key_values=cache, use_cache=True)
        tok = x[:, -1:]
        for i in range(calls + 10):
            t = time.perf_counter()
            model(input_ids=tok, past_key_values=cache, use_cache=True, logits_to_keep=1)
            if i >= 10:
                times.append(time.perf_counter() - t)
            cache.crop(-1)  # transformers 5 takes the number of tokens to remove as a negative count
    return 1e3 * sorted(times)[len(times) // 2]


def pair_report(args, heldout_ids: np.ndarray) -> dict:
    """Draft/target agreement before and after distillation, on held-out stdlib functions and HumanEval.

    For each prompt set, the target continues the first `--report-prompts` prompts greedily and at
    temperature 1 (`distill.generate_windows`); both drafts are scored on those very windows
    (`distill.window_agreement`), plus their held-out corpus loss and decode-step cost.
    """
    import torch

    from acchead.models import load_causal_lm, load_tokenizer
    from acchead.zoo.distill import generate_windows, window_agreement
    from acchead.zoo.prompts import load_prompt_set

    target = load_causal_lm(args.out_dir / TARGET.name)
    tok = load_tokenizer(args.out_dir / TARGET.name)
    drafts = {"before": Path(args.baseline_draft), "after": args.out_dir / DRAFT.name}
    models = {name: load_causal_lm(path) for name, path in drafts.items()}
    report: dict = {"drafts": {k: str(v) for k, v in drafts.items()}, "prompt_sets": {}}
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
    for k, d in models.items():
        report[k] = {"heldout": {m: round(v, 4) for m, v in evaluate(d, heldout_ids, args.seq_len,
                                                                      args.eval_tokens).items()},
                     "decode_step_ms": round(decode_step_ms(d), 3)}
    report["target"] = {"decode_step_ms": round(decode_step_ms(target), 3)}
    threads = torch.get_num_threads()
    report["machine"] = f"{platform.machine()}, {threads} CPU threads, torch {torch.__version__}"
    atomic_write_json(args.out_dir / "pair_report.json", report, sort_keys=False)
    print(json.dumps(report, indent=2))
    return report


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="acchead-build-zoo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stage", choices=["all", "tokenizer", "draft", "target", "report"], default="all",
                   help="which part to build (default: all = tokenizer, target, draft; the distilled draft "
                        "needs the target in --out-dir)")
    p.add_argument("--draft-recipe", choices=["distill", "corpus"], default="distill",
                   help="distill: train the draft on the target's top-k distributions (the shipped draft); "
                        "corpus: next-token loss on the corpus alone (the draft shipped before 0.2)")
    p.add_argument("--distill-init", default="corpus",
                   help="distilled draft's starting weights: 'corpus' (train the corpus draft into "
                        "--work-dir first), 'scratch', or a model directory (default: corpus)")
    p.add_argument("--teacher-topk", type=int, default=32,
                   help="teacher ids kept per position in the distillation cache (default: 32)")
    p.add_argument("--baseline-draft", default=None,
                   help="report stage: the draft to compare against (default: the corpus draft in "
                        "--work-dir/corpus)")
    p.add_argument("--report-prompts", type=int, default=64,
                   help="report stage: prompts of each set the target continues (default: 64)")
    p.add_argument("--probe-tokens", type=int, default=16_384,
                   help="held-out tokens on which draft/target agreement is logged at each checkpoint")
    p.add_argument("--out-dir", type=Path, default=ZOO_DIR, help="where pycode-draft/ and pycode-target/ go")
    p.add_argument("--work-dir", type=Path, default=Path("work/zoo"),
                   help="tokenized corpus and resumable checkpoints (default: work/zoo)")
    p.add_argument("--vocab-size", type=int, default=4096, help="BPE vocabulary size (default: 4096)")
    p.add_argument("--seq-len", type=int, default=512, help="training window in tokens (default: 512)")
    p.add_argument("--batch-size", type=int, default=16, help="windows per optimiser step (default: 16)")
    p.add_argument("--budget-scale", type=float, default=1.0,
                   help="multiply both models' token and time budgets (0.01 for a smoke run)")
    p.add_argument("--eval-tokens", type=int, default=150_000, help="held-out tokens to evaluate on")
    p.add_argument("--ckpt-minutes", type=float, default=3.0, help="minutes between checkpoints")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                   help="bf16 autocast for training steps (default: on where the CPU has native bf16 "
                        "(avx512_bf16/amx_bf16): 2.5x faster there, but 4-6x SLOWER than fp32 on a CPU "
                        "without it (both measured))")
    p.add_argument("--seed", type=int, default=0, help="seed for init and batch sampling")
    return p


@cli_errors
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.bf16 is None:
        args.bf16 = cpu_has_native_bf16()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    tok_dir = train_tokenizer(args.work_dir, args.vocab_size)
    if args.stage == "tokenizer":
        return 0
    train_ids, heldout_ids = tokenize_corpus(args.work_dir, tok_dir)
    print(f"corpus: {len(train_ids):,} train tokens, {len(heldout_ids):,} held-out tokens", file=sys.stderr)
    if args.stage in ("all", "target"):
        train_lm(TARGET, tok_dir, heldout_ids, args, lm_sampler(train_ids, args.batch_size, args.seq_len))
    if args.stage in ("all", "draft"):
        corpus_sampler = lm_sampler(train_ids, args.batch_size, args.seq_len)
        if args.draft_recipe == "corpus":
            train_lm(DRAFT, tok_dir, heldout_ids, args, corpus_sampler)
            return 0
        if not (args.out_dir / TARGET.name / "config.json").exists():
            raise AccheadError(f"the distilled draft needs the target: no {args.out_dir / TARGET.name}; "
                               "build it first (--stage target)")
        init: Path | None
        if args.distill_init == "scratch":
            init = None
        elif args.distill_init == "corpus":
            init = args.work_dir / "corpus" / DRAFT.name
            if not (init / "config.json").exists():
                corpus_args = argparse.Namespace(**{**vars(args), "out_dir": args.work_dir / "corpus"})
                train_lm(DRAFT, tok_dir, heldout_ids, corpus_args, corpus_sampler)
        else:
            init = Path(args.distill_init)
            if not (init / "config.json").exists():
                raise AccheadError(f"--distill-init {init}: not a model directory (no config.json)")
        distill_draft(tok_dir, train_ids, heldout_ids, args, init)
    if args.stage in ("all", "report"):
        args.baseline_draft = args.baseline_draft or str(args.work_dir / "corpus" / DRAFT.name)
        pair_report(args, heldout_ids)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
