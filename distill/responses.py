"""The target's own responses to training prompts: the text a draft for that target is distilled on.

A draft trained on text the target did not write transfers poorly to what the target writes (measured in
`../shared/notes/real-pair.md`: 0.39 top-1 agreement on ShareGPT's own text, 0.12-0.22 on the target's
responses), so the draft is distilled on the target's greedy responses to the prompts it will serve:
ShareGPT's opening turns through the chat template, and Python function headers as raw completions (the
form HumanEval prompts take).

    acchead-distill responses --out data/smollm2/responses --num-prompts 4000

The plan (which prompt goes where) is a pure function of the arguments: prompt i of the plan is ShareGPT's
or the code set's, interleaved `--code-every`; shard k holds plan items [k*S, (k+1)*S). Each shard is
written atomically as `shard-KKKKK.npz` once all its prompts are answered, so a killed run loses at most the
shard in flight and a rerun (the same arguments) resumes after the last complete shard; shards are small
(2 bytes per token) so a run longer than one machine's life continues from shards committed to git.
Generation is batched (left-padded `generate`, prompts of a batch sorted by length): ~5x the tokens/s of
batch 1 on a 2-core CPU. `--dtype bfloat16` answers with the target's weights in bfloat16: on a CPU with
bfloat16 matrix units (AMX) 1.8x float32's tokens/s (312 against 174 at batch 64, 2 threads, 2026-11-27;
407 at batch 128); its greedy text leaves float32's within 32 tokens in about half of the answers
(ties the rounding breaks otherwise), still text this target writes. Each shard records the dtype it was
answered in (`weights_dtype`), so a directory may mix them; the dtype is not part of the config a rerun
must match, like the batch size (left padding moves float32's results by rounding too).

Shard arrays: `prompt` / `response` (concatenated uint16 ids) with `prompt_offsets` / `response_offsets`
(int64, n + 1), `plan_index` (int64), `chat` (bool), `ended` (bool: the response ends with EOS),
`weights_dtype` (a 0-d string array; absent from shards written before it: float32).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from acchead.errors import AccheadError
from acchead.prompting import encode_prompt
from acchead.rundir import atomic_write, atomic_write_json

SHARD_GLOB = "shard-*.npz"


@dataclass(frozen=True)
class PlanItem:
    """One prompt of the plan: its text, whether it is a chat turn, and where it came from."""

    text: str
    chat: bool
    source: str  # "sharegpt" | "code" | "mtbench" | "humaneval"


@dataclass(frozen=True)
class ResponseShard:
    """The prompts and greedy responses of one shard, as token-id lists."""

    plan_index: list[int]
    prompts: list[list[int]]
    responses: list[list[int]]
    chat: list[bool]
    ended: list[bool]
    weights_dtype: str = "float32"  # the target's weights while answering (shards before it: float32)


def build_plan(
    chat_prompts: list[str],
    code_prompts: list[str],
    num: int,
    code_every: int,
    more_chat: list[str] = (),
) -> list[PlanItem]:
    """`num` prompts: every `code_every`-th a code prompt (0: none), the rest chat, each set in its order;
    once `chat_prompts` run out, `more_chat` (ShareGPT's later turns) goes on as chat. A longer plan only
    appends to a shorter one, so a larger `--num-prompts` extends a finished run."""
    chat = [(t, "sharegpt") for t in chat_prompts] + [(t, "sharegpt-turn") for t in more_chat]
    plan, c, k = [], 0, 0
    for i in range(num):
        if code_every and i % code_every == code_every - 1 and k < len(code_prompts):
            plan.append(PlanItem(code_prompts[k], False, "code"))
            k += 1
        elif c < len(chat):
            plan.append(PlanItem(chat[c][0], True, chat[c][1]))
            c += 1
        else:
            break
    return plan


def encode(tokenizer, item: PlanItem) -> list[int]:
    """A plan item's prompt ids: a chat turn through the tokenizer's chat template, code as raw text."""
    return encode_prompt(tokenizer, item.text, chat=item.chat)


@torch.inference_mode()
def greedy_batch(
    target, prompts: list[list[int]], max_new_tokens: int, eos_ids: list[int], pad_id: int
) -> list[tuple[list[int], bool]]:
    """Greedy responses to `prompts` in one left-padded `generate`; per prompt (ids through the first EOS,
    ended with EOS)."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, p in enumerate(prompts):
        ids[r, width - len(p) :] = torch.tensor(p)
        mask[r, width - len(p) :] = 1
    out = target.generate(
        input_ids=ids.to(target.device), attention_mask=mask.to(target.device),
        max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos_ids, pad_token_id=pad_id,
    )  # fmt: skip
    results = []
    for row in out[:, width:].tolist():
        end = next((i for i, t in enumerate(row) if t in eos_ids), None)
        results.append((row if end is None else row[: end + 1], end is not None))
    return results


def ragged(seqs: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Token-id lists as (concatenated uint16 ids, int64 offsets of length n + 1)."""
    offsets = np.concatenate([[0], np.cumsum([len(x) for x in seqs])]).astype(np.int64)
    return np.array([t for x in seqs for t in x], dtype=np.uint16), offsets


def save_npz(path: Path, arrays: dict[str, np.ndarray], compress: bool = True) -> None:
    """`arrays` as one .npz (compressed unless `compress` is False), written atomically."""

    def write(tmp: Path) -> None:
        with tmp.open("wb") as f:
            (np.savez_compressed if compress else np.savez)(f, **arrays)

    atomic_write(path, write)


def save_shard(path: Path, shard: ResponseShard) -> None:
    (prompt, prompt_offsets), (response, response_offsets) = ragged(shard.prompts), ragged(shard.responses)
    save_npz(path, {
        "plan_index": np.array(shard.plan_index, dtype=np.int64),
        "prompt": prompt, "prompt_offsets": prompt_offsets,
        "response": response, "response_offsets": response_offsets,
        "chat": np.array(shard.chat, dtype=bool), "ended": np.array(shard.ended, dtype=bool),
        "weights_dtype": np.array(shard.weights_dtype),
    })  # fmt: skip


def load_shard(path: Path) -> ResponseShard:
    with np.load(path) as z:
        po, ro = z["prompt_offsets"], z["response_offsets"]
        p, r = z["prompt"].astype(np.int64), z["response"].astype(np.int64)
        n = len(z["plan_index"])
        return ResponseShard(
            plan_index=z["plan_index"].tolist(),
            prompts=[p[po[i] : po[i + 1]].tolist() for i in range(n)],
            responses=[r[ro[i] : ro[i + 1]].tolist() for i in range(n)],
            chat=z["chat"].tolist(),
            ended=z["ended"].tolist(),
            weights_dtype=str(z["weights_dtype"]) if "weights_dtype" in z else "float32",
        )


def load_responses(directory: Path) -> list[ResponseShard]:
    """Every complete shard of a responses directory, in shard order."""
    return [load_shard(p) for p in sorted(Path(directory).glob(SHARD_GLOB))]


@dataclass(frozen=True)
class ResponsesConfig:
    """What a responses directory depends on (recorded in `responses.json`; a rerun must match it)."""

    target: str  # the target's fingerprint (acchead.models.model_identity)
    prompts: str  # "train" (the plan), "mtbench" or "humaneval"
    num_prompts: int
    code_every: int
    max_new_tokens: int
    max_prompt_tokens: int
    shard_prompts: int
    heldout_chat: int  # ShareGPT's last prompts, kept out of training (a held-out chat set)


def run_responses(
    target, tokenizer, plan: list[PlanItem], out: Path, config: ResponsesConfig, batch_size: int,
    max_seconds: float | None = None, group_shards: int = 1,
) -> dict:  # fmt: skip
    """Answer every shard of `plan` not yet in `out`; a summary (prompts, tokens, seconds, tokens/s).

    With `max_seconds`, no new group of shards starts once that much time has passed: the run stops
    between groups with everything answered saved (a kill would lose the group in flight), and a rerun
    goes on from there. `group_shards` shards at least are answered together, so that their prompts, sorted
    by length, pad less in each batch."""
    out.mkdir(parents=True, exist_ok=True)
    meta_path = out / "responses.json"
    if meta_path.is_file():
        old = json.loads(meta_path.read_text())["config"]
        diff = sorted(k for k, v in asdict(config).items() if k != "num_prompts" and old.get(k) != v)
        if diff:
            raise AccheadError(f"{out} holds responses made with other settings ({', '.join(diff)})")
    atomic_write_json(meta_path, {"config": asdict(config), "complete": False})
    weights_dtype = str(next(target.parameters()).dtype).removeprefix("torch.")
    eos = tokenizer.eos_token_id
    config_eos = target.generation_config.eos_token_id
    eos_ids = sorted({eos, *([config_eos] if isinstance(config_eos, int) else config_eos or [])})
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    s = config.shard_prompts
    shards = [k for k in range((len(plan) + s - 1) // s) if not (out / f"shard-{k:05d}.npz").is_file()]
    # The pending shards go in groups of max(group_shards, ceil(batch_size / S)) (a GPU's batch spans
    # several shards), each group's prompts sorted by length and cut into batches, each shard written once
    # its group is answered: a batch of ShareGPT turns (median 48 tokens, longest ~350) padded to its
    # longest prompt wastes most of its prefill, and a larger group sorts more prompts before cutting.
    per_group = max(1, group_shards, -(-batch_size // s))
    tokens, skipped, start = 0, 0, time.perf_counter()
    bar = tqdm(total=len(shards), desc="responses (shards)", unit="shard")
    stopped, written = False, 0
    for g in range(0, len(shards), per_group):
        if max_seconds is not None and time.perf_counter() - start >= max_seconds:
            stopped = True
            break
        group = shards[g : g + per_group]
        items = {k: list(range(k * s, min((k + 1) * s, len(plan)))) for k in group}
        enc = {i: encode(tokenizer, plan[i]) for k in group for i in items[k]}
        keep = {k: sorted((i for i in items[k] if len(enc[i]) <= config.max_prompt_tokens),
                          key=lambda i: len(enc[i])) for k in group}  # fmt: skip
        skipped += sum(len(items[k]) - len(keep[k]) for k in group)
        pending = sorted((i for k in group for i in keep[k]), key=lambda i: len(enc[i]))
        answers: dict[int, tuple[list[int], bool]] = {}
        for b in range(0, len(pending), batch_size):
            batch = pending[b : b + batch_size]
            for i, ans in zip(batch, greedy_batch(target, [enc[i] for i in batch], config.max_new_tokens,
                                                  eos_ids, pad), strict=True):  # fmt: skip
                answers[i] = ans
                tokens += len(ans[0])
            bar.set_postfix(tok_s=f"{tokens / (time.perf_counter() - start):.1f}")
        for k in group:
            kept = keep[k]
            shard = ResponseShard(
                plan_index=kept, prompts=[enc[i] for i in kept], responses=[answers[i][0] for i in kept],
                chat=[plan[i].chat for i in kept], ended=[answers[i][1] for i in kept],
                weights_dtype=weights_dtype,
            )  # fmt: skip
            save_shard(out / f"shard-{k:05d}.npz", shard)
            written += 1
            bar.update(1)
    bar.close()
    seconds = time.perf_counter() - start
    summary = {
        "shards_written": written,
        "tokens": tokens,
        "seconds": round(seconds, 1),
        "tokens_per_s": round(tokens / seconds, 1) if seconds else None,
        "skipped_long": skipped,
        "weights_dtype": weights_dtype,
    }
    complete = not stopped and written == len(shards)
    atomic_write_json(meta_path, {"config": asdict(config), "complete": complete, "last_run": summary})
    return summary
