"""The target's final hidden states over its own responses: what a feature draft (EAGLE) learns from.

A feature draft (`acchead.feature_draft`) reads the target's last hidden state at every committed position,
so its training text needs those states: one teacher-forced target forward over prompt + response per
response, no sampling, no LM head. Each response shard `shard-KKKKK.npz` of a responses directory gets a
features file `features-KKKKK.npz` beside it in the output directory, written atomically once the shard
is done, so a killed run loses at most one shard and a rerun resumes.

    acchead-distill features --responses data/smollm2/responses --out runs/smollm2-features/responses
    acchead-distill features --teacher data/smollm2/teacher --out runs/smollm2-features/teacher

A teacher directory (`acchead.distill.teacher`: ShareGPT's exchanges with the target's argmax at each reply
position) works the same way, `teacher-KKKKK.npz` → `features-KKKKK.npz`: the states over text the target
did not write, ~10x cheaper per labelled token than a response, which widens a feature draft's training set
as the teacher labels widen an independent draft's.

Why bfloat16 autocast where the hardware computes in it (`--dtype auto`, `acchead.models.native_bfloat16`:
a GPU, or a CPU with AMX or AVX-512 BF16): with AMX (recent Xeons) it doubles the teacher-forced throughput
(measured on the 2-core box, SmolLM2-135M, 16 × 192 tokens: 1,550 tokens/s against 800 in float32,
2026-11-26) at a mean relative error of 1.5% in the states, far below the noise feature drafts are trained
with. Elsewhere it is emulated: on an AVX2-only AMD EPYC (2 threads, 2026-12-07) 63 positions/s against
424 in float32, so there `auto` is float32. The states are stored as float16 (2 bytes per value: 576
values per token on SmolLM2, ~1.2 kB per token, so these files stay out of git).

Features file arrays: `features` (N, W) float16, the states of every position of every response of the
shard (prompt and response), concatenated in the shard's order; `offsets` (n + 1,) int64 into it; `layers`
(m,) int64: the decoder layers whose outputs follow the final state (`--fused-layers`, EAGLE-3's fused states;
W = (1 + m) × H; absent in older files: none).
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from acchead.distill.responses import SHARD_GLOB, load_shard, save_npz
from acchead.distill.teacher import SHARD_GLOB as TEACHER_GLOB
from acchead.distill.teacher import load_teacher_shard
from acchead.errors import AccheadError
from acchead.feature_chain import target_states


def features_path(out: Path, shard_path: Path) -> Path:
    """The features file of a response or teacher shard (`shard-KKKKK.npz`, `teacher-KKKKK.npz` →
    `features-KKKKK.npz`)."""
    return Path(out) / ("features-" + shard_path.name.split("-", 1)[1])


def text_shards(directory: Path) -> list[Path]:
    """The shards of a responses or a teacher directory, in order; one line if it holds neither."""
    shards = sorted(Path(directory).glob(SHARD_GLOB)) or sorted(Path(directory).glob(TEACHER_GLOB))
    if not shards:
        raise AccheadError(f"{directory}: no response or teacher shards (acchead-distill responses, teacher)")
    return shards


def shard_sequences(path: Path) -> list[list[int]]:
    """The token ids a shard's states cover: prompt + response per response, or each exchange of a
    teacher shard."""
    if path.name.startswith("teacher-"):
        return load_teacher_shard(path).ids
    shard = load_shard(path)
    return [p + r for p, r in zip(shard.prompts, shard.responses, strict=True)]


@torch.inference_mode()
def shard_features(
    target, seqs: list[list[int]], batch_tokens: int, bf16: bool, layers: tuple[int, ...] = ()
) -> list[np.ndarray]:
    """The target's final hidden states over each token-id list of `seqs` (`shard_sequences`): (T_i, H)
    float16 each, or with `layers` (indices of decoder layers below the last) (T_i, (1 + len(layers)) × H):
    the final state, then each of those layers' outputs (what a draft with `fused_layers` reads).

    Sequences are sorted by length and right-padded into batches of about `batch_tokens` tokens (a causal
    model's states at real positions do not depend on padding after them)."""
    last = target.config.num_hidden_layers - 1
    if any(not 0 <= i < last for i in layers):
        raise AccheadError(
            f"--fused-layers {list(layers)}: each must be a layer below the target's last ({last})"
        )
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    out: list[np.ndarray | None] = [None] * len(seqs)
    device = target.device
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else nullcontext()
    b = 0
    while b < len(order):
        e = b + 1  # grow the batch while it stays under the token budget (the longest row sets the width)
        while e < len(order) and (e + 1 - b) * len(seqs[order[e]]) <= batch_tokens:
            e += 1
        batch = order[b:e]
        width = len(seqs[batch[-1]])
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        for row, i in enumerate(batch):
            ids[row, : len(seqs[i])] = torch.tensor(seqs[i])
            mask[row, : len(seqs[i])] = 1
        with autocast:
            hidden = target_states(target, layers, input_ids=ids.to(device), attention_mask=mask.to(device),
                                   use_cache=False)  # fmt: skip  # (B, width, W)
        hidden = hidden.to(torch.float16).cpu()  # one rounding, as float32 then float16; half the copy
        for row, i in enumerate(batch):
            out[i] = hidden[row, : len(seqs[i])].numpy()
        b = e
    return out  # type: ignore[return-value]


def run_features(
    target, responses: Path, out: Path, batch_tokens: int = 3072, bf16: bool = True,
    max_seconds: float | None = None, layers: tuple[int, ...] = (),
) -> dict:  # fmt: skip
    """Write the features file of every shard of `responses` (a responses or a teacher directory) that
    `out` lacks (with `layers`' outputs after the final state: `shard_features`); a summary dict."""
    shards = text_shards(responses)
    out.mkdir(parents=True, exist_ok=True)
    todo = [p for p in shards if not features_path(out, p).is_file()]
    tokens, start, written = 0, time.perf_counter(), 0
    bar = tqdm(total=len(todo), desc="features (shards)", unit="shard")
    for path in todo:
        if max_seconds is not None and time.perf_counter() - start >= max_seconds:
            break
        states = shard_features(target, shard_sequences(path), batch_tokens, bf16, layers)
        offsets = np.cumsum([0, *(len(s) for s in states)]).astype(np.int64)
        # uncompressed: zlib shrinks float16 states by 7% for 0.39 s a shard (this 2-core box), while an H200
        # wrote ~1 shard a second in all (2026-11-28): the time went to the host, not the GPU
        arrays = {"features": np.concatenate(states), "offsets": offsets,
                  "layers": np.array(layers, dtype=np.int64)}  # fmt: skip
        save_npz(features_path(out, path), arrays, compress=False)
        tokens += int(offsets[-1])
        written += 1
        bar.update(1)
        bar.set_postfix(tok_s=f"{tokens / (time.perf_counter() - start):.0f}")
    bar.close()
    seconds = time.perf_counter() - start
    return {
        "shards_written": written,
        "shards_missing": len(todo) - written,
        "tokens": tokens,
        "seconds": round(seconds, 1),
        "tokens_per_s": round(tokens / seconds, 1) if seconds else None,
    }


def load_features(out: Path, shard_path: Path, layers: tuple[int, ...] = ()) -> list[np.ndarray]:
    """The (T_i, W) float16 states of each response of a shard, from its features file; one line if the
    file's fused layers are not `layers` (a draft reads exactly those)."""
    path = features_path(out, shard_path)
    if not path.is_file():
        raise AccheadError(f"{path} is missing: run `acchead-distill features` on {shard_path.parent}")
    with np.load(path) as z:
        stored = tuple(int(i) for i in z["layers"]) if "layers" in z.files else ()
        if stored != tuple(layers):
            flag = f" --fused-layers {','.join(map(str, layers))}" if layers else ""
            raise AccheadError(
                f"{path} holds the states of layers {list(stored)} after the final one, the draft reads "
                f"{list(layers)}: run `acchead-distill features{flag}` again into another directory"
            )
        feats, offsets = z["features"], z["offsets"]
        return [feats[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)]
