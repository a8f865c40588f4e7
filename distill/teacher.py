"""The target's argmax over ShareGPT's opening exchanges, teacher-forced: labels ~10x cheaper than responses.

A response costs one target step per token (~40-90 tokens/s batched on a 2-core CPU); a teacher-forced pass
labels every position of a given text in one forward (~500 tokens/s). The label is the same function the
draft must learn -- the target's argmax given the context -- only the contexts differ: ShareGPT's (GPT's)
replies instead of the target's own. So these labels widen the draft's training set cheaply, and the
target's own responses (`acchead.distill.responses`) keep it on the text it will actually draft.

    acchead-distill teacher --out data/smollm2/teacher --num-exchanges 4000

An exchange is a ShareGPT conversation's opening human turn through the chat template (exactly the ids a
decode of that prompt starts from) followed by GPT's reply and EOS, cut to `max_len` tokens. Labelled are the
positions whose next token belongs to the reply: `labels[j]` is the target's argmax after
`ids[: prompt_len + j]` (j = 0 .. len(ids) - prompt_len). Openings the responses plan holds out
(`chat_sets.SHAREGPT_HELDOUT`) never enter. Shards are written atomically and a rerun resumes after the last
complete one, like the responses.

Shard arrays: `ids` (concatenated uint16) with `offsets` (int64, n + 1), `prompt_len` (int64), `labels`
(concatenated uint16, len(ids) - prompt_len + 1 per exchange).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from acchead.distill.responses import ragged, save_npz
from acchead.errors import AccheadError
from acchead.rundir import atomic_write_json

SHARD_GLOB = "teacher-*.npz"
META_FILE = "teacher.json"


@dataclass(frozen=True)
class TeacherShard:
    """Exchanges as token-id lists: `ids[i]` (prompt + reply), `prompt_len[i]`, and `labels[i]`, the
    target's argmax after each prefix `ids[i][: prompt_len[i] + j]`."""

    ids: list[list[int]]
    prompt_len: list[int]
    labels: list[list[int]]


def exchange_ids(tokenizer, prompt_ids: list[int], reply: str, max_len: int) -> list[int]:
    """`prompt_ids` + the reply's ids + EOS, cut to `max_len` (the reply tokenised on its own, so the prefix
    is exactly the prompt a decode starts from)."""
    reply_ids = tokenizer(reply, add_special_tokens=False).input_ids
    return (prompt_ids + reply_ids + [tokenizer.eos_token_id])[:max_len]


@torch.inference_mode()
def label_batch(target, batch: list[tuple[list[int], int]], pad_id: int) -> list[list[int]]:
    """The target's argmax at every reply position of each `(ids, prompt_len)`, one right-padded forward;
    the LM head runs only on those positions (it is a fifth of a small target's multiply-adds)."""
    width = max(len(ids) for ids, _ in batch)
    x = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(x)
    for r, (ids, _) in enumerate(batch):
        x[r, : len(ids)], mask[r, : len(ids)] = torch.tensor(ids), 1
    hidden = target.model(input_ids=x.to(target.device), attention_mask=mask.to(target.device))
    hidden = hidden.last_hidden_state  # (B, T, H)
    head = target.get_output_embeddings()
    out = []
    for r, (ids, p) in enumerate(batch):
        logits = head(hidden[r, p - 1 : len(ids)])  # (len - p + 1, V): after ids[:p], ..., after ids
        out.append(logits.argmax(-1).tolist())
    return out


def save_teacher_shard(path: Path, shard: TeacherShard) -> None:
    (ids, offsets), (labels, _) = ragged(shard.ids), ragged(shard.labels)
    save_npz(path, {"ids": ids, "offsets": offsets, "prompt_len": np.array(shard.prompt_len, dtype=np.int64),
                    "labels": labels})  # fmt: skip


def load_teacher_shard(path: Path) -> TeacherShard:
    with np.load(path) as z:
        ids, off, plen = z["ids"].astype(np.int64), z["offsets"], z["prompt_len"].tolist()
        flat = z["labels"].astype(np.int64)
    seqs = [ids[off[i] : off[i + 1]].tolist() for i in range(len(plen))]
    label_off = np.concatenate([[0], np.cumsum([len(s) - p + 1 for s, p in zip(seqs, plen, strict=True)])])
    if label_off[-1] != len(flat):
        raise AccheadError(f"{path}: {len(flat)} labels for exchanges that need {label_off[-1]}")
    labels = [flat[label_off[i] : label_off[i + 1]].tolist() for i in range(len(plen))]
    return TeacherShard(ids=seqs, prompt_len=plen, labels=labels)


def load_teacher(directory: Path) -> list[TeacherShard]:
    """Every complete shard of a teacher directory, in shard order."""
    return [load_teacher_shard(p) for p in sorted(Path(directory).glob(SHARD_GLOB))]


def pack_teacher(shards: list[TeacherShard], to_draft: torch.Tensor, max_len: int) -> list[tuple]:
    """(input ids, labels) per exchange, as `draft.pack_examples` makes them: labels the head row of the
    target's argmax (-1 where the head lacks it) on reply positions, IGNORE (-100) elsewhere."""
    out = []
    for s in shards:
        for ids, p, lab in zip(s.ids, s.prompt_len, s.labels, strict=True):
            n = min(len(ids), max_len)
            if n < p:
                continue
            y = torch.full((n,), -100, dtype=torch.long)
            y[p - 1 :] = to_draft[torch.tensor(lab[: n - p + 1])]
            out.append((torch.tensor(ids[:n]), y))
    return out


@dataclass(frozen=True)
class TeacherConfig:
    """What a teacher directory depends on (recorded in `teacher.json`; a rerun must match it)."""

    target: str  # the target's fingerprint (acchead.models.model_identity)
    num_exchanges: int
    max_len: int
    shard_exchanges: int


def run_teacher(
    target, tokenizer, exchanges: list[tuple[list[int], int]], out: Path, config: TeacherConfig,
    batch_size: int,
) -> dict:  # fmt: skip
    """Label every shard of `exchanges` ((ids, prompt_len) each) not yet in `out`; a summary."""
    out.mkdir(parents=True, exist_ok=True)
    meta = out / META_FILE
    if meta.is_file():
        old = json.loads(meta.read_text())["config"]
        diff = sorted(k for k, v in asdict(config).items() if k != "num_exchanges" and old.get(k) != v)
        if diff:
            raise AccheadError(f"{out} holds labels made with other settings ({', '.join(diff)})")
    atomic_write_json(meta, {"config": asdict(config), "complete": False})
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    s = config.shard_exchanges
    todo = [k for k in range((len(exchanges) + s - 1) // s) if not (out / f"teacher-{k:05d}.npz").is_file()]
    labelled, start = 0, time.perf_counter()
    bar = tqdm(todo, desc="teacher (shards)", unit="shard")
    for k in bar:
        items = exchanges[k * s : (k + 1) * s]
        order = sorted(range(len(items)), key=lambda i: len(items[i][0]))  # similar lengths per batch
        labels: dict[int, list[int]] = {}
        for b in range(0, len(order), batch_size):
            chosen = order[b : b + batch_size]
            for i, lab in zip(chosen, label_batch(target, [items[i] for i in chosen], pad), strict=True):
                labels[i] = lab
                labelled += len(lab)
            bar.set_postfix(labels_s=f"{labelled / (time.perf_counter() - start):.0f}")
        shard = TeacherShard(ids=[ids for ids, _ in items], prompt_len=[p for _, p in items],
                             labels=[labels[i] for i in range(len(items))])  # fmt: skip
        save_teacher_shard(out / f"teacher-{k:05d}.npz", shard)
    seconds = time.perf_counter() - start
    summary = {"shards_written": len(todo), "labels": labelled, "seconds": round(seconds, 1),
               "labels_per_s": round(labelled / seconds, 1) if seconds else None}  # fmt: skip
    atomic_write_json(meta, {"config": asdict(config), "complete": True, "last_run": summary})
    return summary
