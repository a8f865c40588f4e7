"""Responses generated elsewhere (a serving engine: vLLM, SGLang, TGI, ...): read, validate, encode, emit.

`acchead-gen-data --responses FILE` labels these instead of sampling the target itself (DESIGN §2: the
target's X comes from the engine; labelling needs one teacher-forced forward of each model). FILE is

- JSON lines (`.jsonl`), one object per response, or a `datasets` directory (`save_to_disk`, one split),
  with the prompt as `prompt_ids` (token ids, used as given: any chat template already applied) or `prompt`
  (text, encoded as gen-data encodes prompts, `--chat-template` included), and the response as
  `response_ids` (the engine's token ids, e.g. vLLM's `CompletionOutput.token_ids`) or `response` (text,
  encoded without special tokens). Ids win where both are given. Ids are what the engine sampled; text
  re-encoded may split differently from the engine's tokens, so ids are the exact form.
- optionally `prompt_index` (a distinct int >= 0 on every record, or on none): it seeds the row's random
  streams and names the row in the dataset. Without it, a record's position in FILE is its index.

A response is the target's sample X as is: include the EOS token if the engine stopped on it (its
`token_ids` do; its text usually does not, and then EOS positions go unlabelled: see `ending_with_eos`).
Records that cannot be labelled as X are counted per reason and skipped (`SKIP_REASONS`), never altered;
malformed records (not an object, a missing field, ids that are not integers) are a one-line error.

`emit_responses` writes a finished run's own responses in this format (`--emit-responses`), so labels from
responses can be checked against the online labels of the same responses.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from acchead.data_gen.prompts import encode_prompts
from acchead.errors import AccheadError
from acchead.rundir import atomic_write

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Why a record is not labelled, in the order they are checked (a record counts under its first reason).
SKIP_REASONS = {
    "empty": "empty prompt or response",
    "not_round_trip": "response text the tokenizer does not round-trip",
    "out_of_vocab": "a token id outside the models' embeddings",
    "eos_inside": "an EOS token before the response's last token",
    "too_long": "response longer than --max-new-tokens",
    "over_context": "prompt + response longer than the models' context",
}


@dataclass(frozen=True)
class ResponsesSource:
    """Where responses come from: a `.jsonl` file or a `datasets` directory (`split` of a DatasetDict)."""

    path: str
    split: str = "train"

    def describe(self) -> dict:
        """JSON-able description recorded in gen_config.json."""
        d = {"kind": "responses", **asdict(self)}
        if Path(self.path).suffix.lower() == ".jsonl":
            del d["split"]
        return d


@dataclass
class Record:
    """One validated input record: prompt and response as text (str) or ids (list[int])."""

    prompt: str | list[int]
    response: str | list[int]
    index: int | None = None


@dataclass
class Responses:
    """Encoded records, in file order: R = number of records.

    Attributes:
        indices: (R,) prompt indices (`prompt_index`, or the record's position).
        prompts, responses: R token lists.
        round_trips: (R,) False where a text response decodes to other text than it was encoded from.
        kinds: how many prompts and responses came as text and as ids.
    """

    indices: list[int]
    prompts: list[list[int]]
    responses: list[list[int]]
    round_trips: list[bool]
    kinds: dict[str, int] = field(default_factory=dict)


def read_responses(source: ResponsesSource, limit: int | None = None) -> list[Record]:
    """The first `limit` records (all if None) of FILE, validated in structure; AccheadError on bad input."""
    path = Path(source.path).expanduser()
    if path.is_dir():
        records = list(_dataset_records(path, source.split, limit))
    elif path.suffix.lower() == ".jsonl":
        if not path.is_file():
            raise AccheadError(f"responses file not found: {path}")
        records = list(_jsonl_records(path, limit))
    elif not path.exists():
        raise AccheadError(f"responses file not found: {path}")
    else:
        raise AccheadError(f"{path}: responses must be a .jsonl file or a `datasets` directory")
    if not records:
        raise AccheadError(f"no responses in {path}")
    with_index = sum(r.index is not None for r in records)
    if 0 < with_index < len(records):
        first = next(i for i, r in enumerate(records) if r.index is None)
        raise AccheadError(f"{path}: record {first} has no prompt_index; give it on every record or on none")
    if with_index:
        seen: set[int] = set()
        for i, r in enumerate(records):
            if r.index in seen:
                raise AccheadError(f"{path}: record {i} repeats prompt_index {r.index}")
            seen.add(r.index)  # type: ignore[arg-type]
    else:
        for i, r in enumerate(records):
            r.index = i
    return records


def _jsonl_records(path: Path, limit: int | None) -> Iterator[Record]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise AccheadError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from e
    except OSError as e:
        raise AccheadError(f"cannot read {path}: {e.strerror}") from e
    n = 0
    for number, line in enumerate(lines, start=1):
        if limit is not None and n >= limit:
            return
        if not line.strip():
            continue
        where = f"{path} line {number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise AccheadError(f"{where}: not valid JSON ({e.msg})") from e
        yield _record(obj, where)
        n += 1


def _dataset_records(path: Path, split: str, limit: int | None) -> Iterator[Record]:
    import datasets

    if not any((path / f).exists() for f in ("dataset_info.json", "dataset_dict.json")):
        raise AccheadError(f"{path}: not a `datasets` directory (written by save_to_disk)")
    try:
        ds = datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError) as e:
        raise AccheadError(f"cannot load responses dataset {path}: {str(e).splitlines()[0]}") from e
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise AccheadError(f"dataset {path} has no split {split!r} (splits: {', '.join(ds)})")
        ds = ds[split]
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    for k, row in enumerate(ds):
        # A column missing from some rows reads as None there: drop those keys like an absent JSON field.
        yield _record({c: v for c, v in row.items() if v is not None}, f"{path} row {k}")


def _record(obj: object, where: str) -> Record:
    """Validate one record's structure: an object with a prompt, a response and maybe a prompt_index."""
    if not isinstance(obj, dict):
        raise AccheadError(f"{where}: expected an object, got {type(obj).__name__}")
    parts = []
    for name in ("prompt", "response"):
        if f"{name}_ids" in obj:
            ids = obj[f"{name}_ids"]
            if not isinstance(ids, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in ids
            ):
                raise AccheadError(f"{where}: {name}_ids must be a list of integers")
            parts.append(ids)
        elif name in obj:
            if not isinstance(obj[name], str):
                raise AccheadError(f"{where}: {name} must be a string, got {type(obj[name]).__name__}")
            parts.append(obj[name])
        else:
            fields = ", ".join(map(str, obj)) or "none"
            raise AccheadError(f"{where}: no {name!r} or {name + '_ids'!r} field (fields: {fields})")
    index = obj.get("prompt_index")
    if index is not None and (not isinstance(index, int) or isinstance(index, bool) or index < 0):
        raise AccheadError(f"{where}: prompt_index must be an integer >= 0, got {index!r}")
    return Record(parts[0], parts[1], index)


def encode_responses(
    records: list[Record], tokenizer: PreTrainedTokenizerBase, *, chat_template: bool = False
) -> Responses:
    """Token ids of every record: text prompts as gen-data encodes prompts, text responses without special
    tokens (a response continues the prompt), each checked to decode back to the same text."""
    text_p = [k for k, r in enumerate(records) if isinstance(r.prompt, str) and r.prompt.strip()]
    text_r = [k for k, r in enumerate(records) if isinstance(r.response, str) and r.response]
    prompts = [r.prompt if isinstance(r.prompt, list) else [] for r in records]
    responses = [r.response if isinstance(r.response, list) else [] for r in records]
    if text_p:
        enc = encode_prompts([records[k].prompt for k in text_p], tokenizer, chat_template)  # type: ignore[misc]
        for k, ids in zip(text_p, enc, strict=True):
            prompts[k] = ids
    round_trips = [True] * len(records)
    if text_r:
        texts = [records[k].response for k in text_r]
        enc = tokenizer(texts, add_special_tokens=False).input_ids
        back = tokenizer.batch_decode(enc, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        for k, ids, text, decoded in zip(text_r, enc, texts, back, strict=True):
            responses[k] = ids
            round_trips[k] = decoded == text
    kinds = {
        "prompt_text": sum(isinstance(r.prompt, str) for r in records),
        "prompt_ids": sum(isinstance(r.prompt, list) for r in records),
        "response_text": sum(isinstance(r.response, str) for r in records),
        "response_ids": sum(isinstance(r.response, list) for r in records),
    }
    indices = [k if r.index is None else r.index for k, r in enumerate(records)]
    return Responses(indices, prompts, responses, round_trips, kinds)


def select_responses(
    data: Responses, *, vocab_size: int, eos_ids: Sequence[int], max_new_tokens: int, context: int
) -> tuple[list[int], dict[str, int]]:
    """Which records can be labelled as the target's X: (their positions in `data`, skipped per reason).

    vocab_size: the smaller embedding table of the two models (every id is fed to both).
    """
    skipped = dict.fromkeys(SKIP_REASONS, 0)
    eos, kept = set(eos_ids), []
    for k, (p, r) in enumerate(zip(data.prompts, data.responses, strict=True)):
        if not p or not r:
            reason = "empty"
        elif not data.round_trips[k]:
            reason = "not_round_trip"
        elif not all(0 <= t < vocab_size for t in p) or not all(0 <= t < vocab_size for t in r):
            reason = "out_of_vocab"
        elif any(t in eos for t in r[:-1]):
            reason = "eos_inside"
        elif len(r) > max_new_tokens:
            reason = "too_long"
        elif len(p) + len(r) > context:
            reason = "over_context"
        else:
            kept.append(k)
            continue
        skipped[reason] += 1
    return kept, skipped


def skip_message(skipped: dict[str, int], total: int) -> str | None:
    """One line naming the skipped records per reason, or None if none was skipped."""
    n = sum(skipped.values())
    if not n:
        return None
    parts = [f"{c} {SKIP_REASONS[k]}" for k, c in skipped.items() if c]
    return f"skipping {n} of {total} responses: {'; '.join(parts)}"


def responses_digest(
    indices: Sequence[int], prompts: Sequence[list[int]], responses: Sequence[list[int]]
) -> str:
    """sha256 (16 hex digits) of the labelled (prompt_index, prompt, response) triples: the exact input."""
    h = hashlib.sha256()
    for i, p, r in zip(indices, prompts, responses, strict=True):
        h.update(int(i).to_bytes(8, "little"))
        for ids in (p, r):
            h.update(len(ids).to_bytes(4, "little"))
            h.update(b"".join(int(t).to_bytes(4, "little") for t in ids))
    return h.hexdigest()[:16]


def emit_responses(path: str | Path, out: str | Path) -> int:
    """Write the responses of the finished gen-data run in `out` to `path` as JSON lines (atomic).

    One object per row, in prompt order: `prompt_index`, `prompt_ids`, `response_ids` (the target's X,
    EOS included where it stopped on one): `--responses path` labels them again from these. Returns the
    number of records written.
    """
    import datasets

    table = datasets.load_from_disk(str(out)).data.table.select(
        ["prompt_index", "prompt_ids", "response_ids"]
    )

    def write(p: Path) -> None:
        with open(p, "w", encoding="utf-8") as f:
            for batch in table.to_batches(max_chunksize=4096):
                cols: dict[str, Any] = batch.to_pydict()
                for i, pr, rs in zip(
                    cols["prompt_index"], cols["prompt_ids"], cols["response_ids"], strict=True
                ):
                    f.write(json.dumps({"prompt_index": i, "prompt_ids": pr, "response_ids": rs}) + "\n")

    atomic_write(Path(path).expanduser(), write)
    return table.num_rows
