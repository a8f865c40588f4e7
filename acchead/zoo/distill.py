"""Distilling the demo draft from the demo target: cached top-k teacher distributions and a forward-KL loss.

Deployed drafts are trained to agree with their target (DistillSpec, EAGLE, Medusa); a draft trained on the
corpus alone agrees with the target's greedy choice on ~60% of positions. Here the draft is trained on the
target's next-token distributions over the LM-train corpus (token-level KD, forward KL at temperature 1).

The teacher's forward is the expensive part (the target is ~6x the draft), and the corpus is small (~2.6M
tokens), so the teacher is run ONCE over fixed non-overlapping windows and its distribution kept in top-k
form: the k most likely ids (uint16) and their log-probabilities (float16), plus nothing else -- the mass
outside the top k is `1 - sum(exp(top-k))`. The draft then trains for many epochs over the cache.

Loss (per position): the forward KL between the teacher and the draft, both coarsened to k+1 outcomes
(the teacher's top-k ids, and "any other token"):

    KL_k(p || q) = sum_{v in top-k} p(v) log(p(v)/q(v)) + p_tail log(p_tail / q_tail)

a lower bound on KL(p || q) that is exact when the tail is empty, and whose gradient matches the full KL's
on the ids that carry the teacher's mass. The constant sum p log p is dropped from the training loss.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from acchead.rundir import atomic_write_json


@dataclass(frozen=True)
class TeacherCache:
    """The target's top-k next-token distribution at every position of fixed corpus windows.

    Window w covers corpus ids `[w * seq_len, (w + 1) * seq_len)`; position t of it holds the teacher's
    distribution of the token after `window[: t + 1]`.
    """

    ids: np.ndarray  # (num_windows, seq_len, k) uint16: the teacher's top-k token ids, most likely first
    logp: np.ndarray  # (num_windows, seq_len, k) float16: their log-probabilities
    seq_len: int

    @property
    def num_windows(self) -> int:
        return int(self.ids.shape[0])

    def window_tokens(self, corpus: np.ndarray, w: int) -> np.ndarray:
        """(seq_len,) input ids of window `w`."""
        return corpus[w * self.seq_len : (w + 1) * self.seq_len]


def build_teacher_cache(
    target: torch.nn.Module,
    corpus: np.ndarray,
    seq_len: int,
    k: int,
    path: Path,
    batch_size: int = 8,
    bf16: bool = False,
    ckpt_seconds: float = 60.0,
) -> TeacherCache:
    """Run `target` over every full window of `corpus` and keep its top-k; resumable, atomic when done.

    The windows run on the target's device. `bf16` autocast is off by default: for this inference-only
    forward it was 5x SLOWER than float32 on the 2-core CPU (6.4 s vs 1.3 s for 8 x 512 tokens of the demo
    target, measured), unlike training; the build turns it on for a GPU.
    Progress is written to `<path>/progress.json` at most every `ckpt_seconds`, after the memory-mapped
    arrays are flushed, so a killed run redoes at most that much. A finished cache is marked by
    `<path>/done.json`, written last.
    """
    path.mkdir(parents=True, exist_ok=True)
    n = len(corpus) // seq_len
    shape = (n, seq_len, k)
    done_marker, progress_file = path / "done.json", path / "progress.json"
    meta = {"num_windows": n, "seq_len": seq_len, "k": k, "corpus_tokens": len(corpus)}
    if done_marker.exists() and json.loads(done_marker.read_text()) == meta:
        return load_teacher_cache(path)
    start = 0
    if progress_file.exists():
        prog = json.loads(progress_file.read_text())
        if prog.get("meta") == meta:
            start = int(prog["windows_done"])
    mode = "r+" if start > 0 else "w+"
    ids = np.lib.format.open_memmap(path / "ids.npy", mode=mode, dtype=np.uint16, shape=shape)
    logp = np.lib.format.open_memmap(path / "logp.npy", mode=mode, dtype=np.float16, shape=shape)
    target.eval()
    device = next(target.parameters()).device  # the windows go where the target is (CPU or GPU)
    last = time.time()
    bar = tqdm(total=n, initial=start, unit="win", desc=f"teacher top-{k}")
    with torch.inference_mode():
        for w0 in range(start, n, batch_size):
            w1 = min(n, w0 + batch_size)
            x = torch.from_numpy(corpus[w0 * seq_len : w1 * seq_len].astype(np.int64)).view(w1 - w0, seq_len)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                logits = target(x.to(device)).logits  # (B, T, V)
            lp = torch.log_softmax(logits.float(), dim=-1)
            top = lp.topk(k, dim=-1)  # values/indices: (B, T, k)
            ids[w0:w1] = top.indices.to(torch.int32).cpu().numpy().astype(np.uint16)
            logp[w0:w1] = top.values.cpu().numpy().astype(np.float16)
            bar.update(w1 - w0)
            if time.time() - last > ckpt_seconds or w1 == n:
                ids.flush()
                logp.flush()
                atomic_write_json(progress_file, {"meta": meta, "windows_done": w1})
                last = time.time()
    bar.close()
    del ids, logp
    atomic_write_json(done_marker, meta)
    return load_teacher_cache(path)


def load_teacher_cache(path: Path) -> TeacherCache:
    """Memory-map a finished cache."""
    meta = json.loads((path / "done.json").read_text())
    ids = np.load(path / "ids.npy", mmap_mode="r")
    logp = np.load(path / "logp.npy", mmap_mode="r")
    return TeacherCache(ids=ids, logp=logp, seq_len=int(meta["seq_len"]))


def topk_kl(
    student_logits: torch.Tensor,
    teacher_ids: torch.Tensor,
    teacher_logp: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mean over positions of KL_k(teacher || student) (see the module docstring).

    Args:
        student_logits: (B, T, V) draft logits.
        teacher_ids: (B, T, k) int64 teacher top-k ids.
        teacher_logp: (B, T, k) float32 teacher log-probabilities of those ids.
        mask: (B, T) bool, the positions that count (None: all).
    Returns:
        scalar: the KL including the teacher's entropy terms (so 0 means the coarsened distributions match).
    """
    logq = torch.log_softmax(student_logits.float(), dim=-1)  # (B, T, V)
    logq_k = logq.gather(-1, teacher_ids)  # (B, T, k)
    p_k = teacher_logp.exp()
    p_tail = (1.0 - p_k.sum(-1)).clamp_min(0.0)  # (B, T)
    # The tails are clamped: float16 log-probs can make sum(p_k) exceed 1 by a rounding step.
    q_tail = (1.0 - logq_k.exp().sum(-1)).clamp_min(1e-12)
    tail = p_tail * (torch.log(p_tail.clamp_min(1e-12)) - q_tail.log())
    kl = (p_k * (teacher_logp - logq_k)).sum(-1) + tail  # (B, T)
    return kl.mean() if mask is None else kl[mask].mean()


def sample_kd_batch(
    cache: TeacherCache, corpus: np.ndarray, batch_size: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input ids (B, T), teacher ids (B, T, k), teacher log-probs (B, T, k)) for random windows."""
    ws = torch.randint(0, cache.num_windows, (batch_size,), generator=gen).tolist()
    x = np.stack([cache.window_tokens(corpus, w) for w in ws]).astype(np.int64)
    tid = np.stack([cache.ids[w] for w in ws]).astype(np.int64)
    tlp = np.stack([cache.logp[w] for w in ws]).astype(np.float32)
    return torch.from_numpy(x), torch.from_numpy(tid), torch.from_numpy(tlp)


@torch.no_grad()
def teacher_forced_agreement(
    draft: torch.nn.Module, target: torch.nn.Module, ids: np.ndarray, seq_len: int, max_tokens: int
) -> dict[str, float]:
    """Over held-out windows: P(argmax draft = argmax target), E[sum_v min(p, q)] and KL(p || q), all at T=1.

    `sum_v min(p, q)` is the probability that token verification accepts a draft sample at temperature 1.
    """
    was_training = draft.training
    draft.eval()
    device = next(draft.parameters()).device  # both models on it
    n = min(len(ids) // seq_len, max(1, max_tokens // seq_len))
    agree = acc = kl = 0.0
    tot = 0
    for i in range(n):
        x = torch.from_numpy(ids[i * seq_len : (i + 1) * seq_len].astype(np.int64))[None].to(device)
        lp = torch.log_softmax(target(x).logits[0].float(), -1)  # (T, V)
        lq = torch.log_softmax(draft(x).logits[0].float(), -1)
        agree += (lp.argmax(-1) == lq.argmax(-1)).sum().item()
        acc += torch.minimum(lp, lq).exp().sum(-1).sum().item()
        kl += (lp.exp() * (lp - lq)).sum(-1).sum().item()
        tot += x.shape[1]
    draft.train(was_training)
    return {"agreement": agree / tot, "acceptance_t1": acc / tot, "kl_target_draft": kl / tot, "tokens": tot}


def kd_loss(model: torch.nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """The training objective on one `sample_kd_batch` batch (an optional 4th entry: a (B, T) loss mask)."""
    x, tid, tlp, *mask = batch
    return topk_kl(model(x).logits, tid, tlp, mask[0] if mask else None)


# ------------------------------------------------------------------- sequence-level KD: target's own text


@dataclass(frozen=True)
class GeneratedWindows:
    """Fixed-width windows `[EOS padding | last `context` prompt tokens | target-generated tokens]`.

    Position t of window w holds the target's top-k distribution of token t + 1 (the same layout as
    `TeacherCache`); `start[w]` is the first non-padding position (earlier positions carry no loss).
    """

    tokens: np.ndarray  # (n, W) uint16
    ids: np.ndarray  # (n, W, k) uint16
    logp: np.ndarray  # (n, W, k) float16
    start: np.ndarray  # (n,) int64
    context: int  # prompt part of the width; W - context tokens were generated


@torch.no_grad()
def generate_windows(
    target: torch.nn.Module,
    prompts: list[list[int]],
    context: int,
    new_tokens: int,
    pad_id: int,
    k: int,
    temperature: float = 0.0,
    seed: int = 0,
    batch_size: int = 32,
    desc: str = "target windows",
) -> GeneratedWindows:
    """The target continues each prompt (its last `context` tokens, left-padded with `pad_id`, the corpus's
    document separator, so no attention mask is needed) by `new_tokens` tokens, greedily (temperature 0)
    or by sampling; every position's top-k next-token distribution (temperature 1) is kept."""
    from acchead.kv_decode import KVSequence, decode

    n, width = len(prompts), context + new_tokens
    tokens = np.zeros((n, width), np.uint16)
    ids = np.zeros((n, width, k), np.uint16)
    logp = np.zeros((n, width, k), np.float16)
    start = np.zeros(n, np.int64)
    gen = torch.Generator().manual_seed(seed)
    target.eval()

    def keep(rows: slice, cols: slice, logits: torch.Tensor) -> None:
        top = torch.log_softmax(logits.float(), -1).topk(k, dim=-1)  # (B, T, k)
        ids[rows, cols] = top.indices.numpy().astype(np.uint16)
        logp[rows, cols] = top.values.numpy().astype(np.float16)

    for b0 in tqdm(range(0, n, batch_size), desc=desc, unit="batch"):
        b1 = min(n, b0 + batch_size)
        x = torch.full((b1 - b0, context), pad_id, dtype=torch.long)
        for i, p in enumerate(prompts[b0:b1]):
            tail = p[-context:]
            x[i, context - len(tail) :] = torch.tensor(tail)
            start[b0 + i] = context - len(tail)
        seq = KVSequence(target)
        logits, _ = seq.feed(x, keep=context)  # (B, context, V)
        keep(slice(b0, b1), slice(0, context), logits)
        tokens[b0:b1, :context] = x.numpy()

        def choose(t: int, last: torch.Tensor, rows: slice = slice(b0, b1)) -> torch.Tensor:
            if t:  # `last` follows the token of column context + t - 1: its distribution is kept there
                keep(rows, slice(context + t - 1, context + t), last[:, None])
            if temperature == 0:
                return last.argmax(-1)
            return torch.multinomial(torch.softmax(last.float() / temperature, -1), 1, generator=gen)[:, 0]

        # The last token is fed too: the distribution after it is kept in the last column.
        tokens[b0:b1, context:] = decode(seq, new_tokens, choose, feed_last=True).numpy()
        keep(slice(b0, b1), slice(width - 1, width), seq.logits[:, None])
    return GeneratedWindows(tokens=tokens, ids=ids, logp=logp, start=start, context=context)


@torch.no_grad()
def window_agreement(
    draft: torch.nn.Module, target: torch.nn.Module, greedy: GeneratedWindows, sampled: GeneratedWindows,
    batch_size: int = 32,
) -> dict[str, float]:
    """On the target's own continuations of held-out prompts (the text a decoder verifies):

    - `greedy_agreement`: P(argmax draft = the target's greedy token) over `greedy`'s generated positions;
    - `acceptance_t1`: mean of sum_v min(p, q) at temperature 1 over `sampled`'s generated positions, i.e.
      the probability that token verification accepts a draft sample (gen-data's label mean at T = 1).
    """
    was_training = draft.training
    draft.eval()
    agree = tot_a = acc = tot_s = 0.0
    for windows, greedy_mode in ((greedy, True), (sampled, False)):
        c = windows.context
        for b0 in range(0, len(windows.tokens), batch_size):
            x = torch.from_numpy(windows.tokens[b0 : b0 + batch_size].astype(np.int64))
            lq = torch.log_softmax(draft(x).logits[:, c - 1 : -1].float(), -1)  # (B, N, V)
            if greedy_mode:
                agree += (lq.argmax(-1) == x[:, c:]).sum().item()
                tot_a += x[:, c:].numel()
            else:
                lp = torch.log_softmax(target(x).logits[:, c - 1 : -1].float(), -1)
                acc += torch.minimum(lp, lq).exp().sum(-1).sum().item()
                tot_s += lp.shape[0] * lp.shape[1]
    draft.train(was_training)
    return {"greedy_agreement": agree / tot_a, "acceptance_t1": acc / tot_s}
