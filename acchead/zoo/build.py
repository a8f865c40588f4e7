"""Build the embedded demo pair: a byte-level BPE tokenizer and two Llama LMs trained on stdlib source.

    acchead-build-zoo                      # tokenizer, draft, target (resumes from --work-dir)
    acchead-build-zoo --stage target       # one stage only

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
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from acchead.errors import cli_errors
from acchead.zoo import ZOO_DIR
from acchead.zoo.corpus import read_source, split_files

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


def atomic_save(obj: object, path: Path) -> None:
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


@torch.no_grad()
def evaluate(model, ids: np.ndarray, seq_len: int, max_tokens: int) -> dict[str, float]:
    """Mean next-token loss and top-1 accuracy over non-overlapping windows of held-out ids."""
    model.eval()
    n = min(len(ids) // (seq_len + 1), max(1, max_tokens // seq_len))
    tot_loss, tot_correct, tot = 0.0, 0, 0
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


def train_lm(spec: LMSpec, tok_dir: Path, train_ids: np.ndarray, heldout_ids: np.ndarray, args) -> dict:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tok_dir)
    torch.manual_seed(args.seed)
    model = make_model(spec, tok, args.seq_len)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.peak_lr, betas=(0.9, 0.95), weight_decay=0.1)
    ckpt = args.work_dir / f"{spec.name}.ckpt.pt"
    state = {"step": 0, "tokens": 0, "elapsed": 0.0}
    gen = torch.Generator().manual_seed(args.seed)
    if ckpt.exists():
        saved = torch.load(ckpt, weights_only=False)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        gen.set_state(saved["gen"])
        state = saved["state"]
        print(f"[{spec.name}] resumed at step {state['step']} ({state['tokens']:,} tokens)")
    budget_tokens = int(spec.token_budget * args.budget_scale)
    budget_s = spec.minutes * 60 * args.budget_scale
    tokens_per_step = args.batch_size * args.seq_len
    data = torch.from_numpy(train_ids.astype(np.int64))
    t_start, last_ckpt = time.time() - state["elapsed"], time.time()
    bar = tqdm(total=budget_tokens, initial=state["tokens"], unit="tok", unit_scale=True, desc=spec.name)
    model.train()
    while True:
        elapsed = time.time() - t_start
        progress = max(state["tokens"] / budget_tokens, elapsed / budget_s)
        if progress >= 1.0:
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(progress, spec.peak_lr)
        starts = torch.randint(0, len(data) - args.seq_len - 1, (args.batch_size,), generator=gen)
        batch = torch.stack([data[s : s + args.seq_len] for s in starts.tolist()])  # (B, T)
        # bf16 autocast keeps fp32 master weights; on CPUs with avx512_bf16 it is ~2.5x faster (measured).
        with torch.autocast(batch.device.type, dtype=torch.bfloat16, enabled=args.bf16):
            loss = model(batch, labels=batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        state["step"] += 1
        state["tokens"] += tokens_per_step
        bar.update(tokens_per_step)
        bar.set_postfix(loss=f"{loss.item():.3f}", lr=f"{opt.param_groups[0]['lr']:.1e}")
        if time.time() - last_ckpt > args.ckpt_minutes * 60:
            state["elapsed"] = time.time() - t_start
            atomic_save({"model": model.state_dict(), "opt": opt.state_dict(), "gen": gen.get_state(),
                         "state": state}, ckpt)
            last_ckpt = time.time()
    bar.close()
    state["elapsed"] = time.time() - t_start
    metrics = evaluate(model, heldout_ids, args.seq_len, args.eval_tokens)
    out_dir = args.out_dir / spec.name
    out_dir.mkdir(parents=True, exist_ok=True)
    model.to(torch.float16).save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(tok_dir).save_pretrained(out_dir)
    report = {
        "model": spec.name,
        "spec": asdict(spec),
        "budget_scale": args.budget_scale,
        "parameters": sum(p.numel() for p in model.parameters()),
        "train_tokens": state["tokens"],
        "train_steps": state["step"],
        "train_minutes": round(state["elapsed"] / 60, 2),
        "heldout_loss": round(metrics["loss"], 4),
        "heldout_accuracy": round(metrics["accuracy"], 4),
        "heldout_eval_tokens": metrics["tokens"],
        "seq_len": args.seq_len,
        "batch_size": args.batch_size,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU threads, torch {torch.__version__}",
        "python": platform.python_version(),
    }
    (out_dir / "training_report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return report


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="acchead-build-zoo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stage", choices=["all", "tokenizer", "draft", "target"], default="all",
                   help="which part to build (default: all; earlier stages are built when missing)")
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
    p.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True,
                   help="bf16 autocast for training steps (default: on; --no-bf16 for plain fp32)")
    p.add_argument("--seed", type=int, default=0, help="seed for init and batch sampling")
    return p


@cli_errors
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    tok_dir = train_tokenizer(args.work_dir, args.vocab_size)
    if args.stage == "tokenizer":
        return 0
    train_ids, heldout_ids = tokenize_corpus(args.work_dir, tok_dir)
    print(f"corpus: {len(train_ids):,} train tokens, {len(heldout_ids):,} held-out tokens", file=sys.stderr)
    for spec in (DRAFT, TARGET):
        if args.stage in ("all", spec.name.split("-")[1]):
            train_lm(spec, tok_dir, train_ids, heldout_ids, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
