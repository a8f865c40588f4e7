"""Where prompts come from and how they become token ids.

Three sources, exactly one per run:
- a built-in set by name (`acchead.prompt_sets.load_prompt_set`: "stdlib-functions", "humaneval"; and the
  real pair's chat sets: "sharegpt", "sharegpt-heldout", "mtbench");
- a file: `.jsonl` (one object per line), `.json` (a list of objects or of strings), `.parquet`, or `.txt`
  (one prompt per line; blank lines are separators and skipped). Objects are read at `field` ("prompt");
  an object with `"chat": true` is a chat prompt (one user turn through the chat template);
- a `datasets` dataset: a directory written by `save_to_disk`, or a name already in the local Hugging Face
  cache (never downloaded: data generation must be reproducible from what is on disk), one split, one column.

Empty prompts are refused (there is no context to sample a response from). Prompts too long for the
models' context are skipped, with a count (`fit_to_context`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from acchead.errors import AccheadError
from acchead.prompting import ChatPrompt, encode_prompt

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".txt")


@dataclass(frozen=True)
class PromptSource:
    """One prompt source. kind: "builtin" | "file" | "dataset"; name: set name, file path or dataset."""

    kind: str
    name: str
    field: str = "prompt"
    split: str = "train"

    def describe(self) -> dict:
        """JSON-able description recorded in gen_config.json (only the keys that matter for the kind)."""
        d = asdict(self)
        if self.kind == "builtin":
            del d["field"], d["split"]
        elif self.kind == "file":
            del d["split"]
        return d


def load_prompts(source: PromptSource, limit: int | None = None) -> list[str]:
    """The first `limit` prompts (all if None) of a source; AccheadError on bad input."""
    if source.kind == "builtin":
        from acchead.prompt_sets import load_prompt_set

        prompts = load_prompt_set(source.name, limit=limit)  # AccheadError on an unknown name
    elif source.kind == "file":
        prompts = _read_file(Path(source.name), source.field)
    elif source.kind == "dataset":
        prompts = _read_dataset(source.name, source.split, source.field)
    else:
        raise AccheadError(f"unknown prompt source kind {source.kind!r}")
    prompts = prompts[:limit] if limit is not None else prompts
    if not prompts:
        raise AccheadError(f"no prompts in {source.kind} {source.name}")
    for i, p in enumerate(prompts):
        if not isinstance(p, str):
            raise AccheadError(f"prompt {i} of {source.name} is a {type(p).__name__}, not a string")
        if not p.strip():
            raise AccheadError(f"prompt {i} of {source.name} is empty")
    return prompts


def _field(obj: object, field: str, where: str) -> object:
    if isinstance(obj, str):
        return obj
    if not isinstance(obj, dict):
        raise AccheadError(f"{where}: expected an object or a string, got {type(obj).__name__}")
    if field not in obj:
        raise AccheadError(
            f"{where}: no prompt field {field!r} (fields: {', '.join(map(str, obj)) or 'none'})"
        )
    return obj[field]


def _read_file(path: Path, field: str) -> list[str]:
    suffix = path.suffix.lower()
    if suffix not in FILE_SUFFIXES:
        raise AccheadError(
            f"{path}: unknown prompt file type {suffix!r}; use one of {', '.join(FILE_SUFFIXES)}"
        )
    if not path.is_file():
        raise AccheadError(f"prompt file not found: {path}")
    if suffix == ".parquet":
        return _read_parquet(path, field)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise AccheadError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from e
    except OSError as e:
        raise AccheadError(f"cannot read {path}: {e.strerror}") from e
    if suffix == ".txt":
        return [line for line in text.splitlines() if line.strip()]
    if suffix == ".jsonl":
        out = []
        for n, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                obj = _json(line, f"{path} line {n}")
                out.append(_as_chat(obj, _field(obj, field, f"{path} line {n}"), f"{path} line {n}"))
        return out
    data = _json(text, str(path))
    if not isinstance(data, list):
        raise AccheadError(f"{path}: expected a JSON list of prompts, got {type(data).__name__}")
    return [
        _as_chat(item, _field(item, field, f"{path} item {i}"), f"{path} item {i}")
        for i, item in enumerate(data)
    ]


def _as_chat(obj: object, prompt: object, where: str) -> object:
    """`prompt` as a `ChatPrompt` when its object says `"chat": true` (a user turn for the chat template)."""
    chat = obj.get("chat", False) if isinstance(obj, dict) else False
    if not isinstance(chat, bool):
        raise AccheadError(f'{where}: "chat" must be true or false, got {chat!r}')
    return ChatPrompt(prompt) if chat and isinstance(prompt, str) else prompt


def _json(text: str, where: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise AccheadError(f"{where}: not valid JSON ({e.msg})") from e


def _read_parquet(path: Path, field: str) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(path)
        if field not in schema.names:
            raise AccheadError(f"{path}: no prompt field {field!r} (columns: {', '.join(schema.names)})")
        return pq.read_table(path, columns=[field]).column(field).to_pylist()
    except (pa.ArrowInvalid, OSError) as e:
        raise AccheadError(f"cannot read {path} as parquet: {str(e).splitlines()[0]}") from e


@contextlib.contextmanager
def _hub_offline() -> Iterator[None]:
    """Make `datasets` resolve names from the local cache only, for the duration of one load."""
    import datasets

    saved = datasets.config.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE = saved


def _read_dataset(name: str, split: str, field: str) -> list[str]:
    import datasets

    try:
        local = Path(name)
        if local.is_dir() and any((local / f).exists() for f in ("dataset_info.json", "dataset_dict.json")):
            ds = datasets.load_from_disk(name)
            if isinstance(ds, datasets.DatasetDict):
                if split not in ds:
                    raise AccheadError(f"dataset {name} has no split {split!r} (splits: {', '.join(ds)})")
                ds = ds[split]
        else:
            with _hub_offline():
                ds = datasets.load_dataset(name, split=split)
    except (FileNotFoundError, ValueError, ConnectionError) as e:
        raise AccheadError(
            f"cannot load dataset {name!r} split {split!r} from disk or the local cache: "
            f"{str(e).splitlines()[0]}"
        ) from e
    if field not in ds.column_names:
        raise AccheadError(
            f"dataset {name}: no prompt field {field!r} (columns: {', '.join(ds.column_names)})"
        )
    return ds[field]


def encode_prompts(
    prompts: list[str], tokenizer: PreTrainedTokenizerBase, chat_template: bool = False
) -> list[list[int]]:
    """Token ids of each prompt (`acchead.prompting.encode_prompt`): a `ChatPrompt` (a file line with
    `"chat": true`, MT-bench) goes through the tokenizer's chat template as one user turn, the rest as raw
    text with the tokenizer's special tokens; `chat_template` makes every prompt a chat turn."""
    return [encode_prompt(tokenizer, p, chat=chat_template) for p in prompts]


def fit_to_context(prompt_ids: list[list[int]], max_new_tokens: int, context: int) -> list[int]:
    """Indices of prompts with room for a full response: len(prompt) + max_new_tokens <= context.

    Longer prompts are skipped (the caller reports the count) rather than truncated: cutting a prompt
    changes what the response is conditioned on, and a shortened response budget would bias lengths.
    """
    for i, ids in enumerate(prompt_ids):
        if not ids:
            raise AccheadError(f"prompt {i} encodes to no tokens")
    return [i for i, ids in enumerate(prompt_ids) if len(ids) + max_new_tokens <= context]


def prompts_digest(prompt_ids: list[list[int]]) -> str:
    """sha256 (16 hex digits) of the encoded prompt list: a run's identity includes its exact inputs."""
    h = hashlib.sha256()
    for ids in prompt_ids:
        h.update(len(ids).to_bytes(4, "little"))
        h.update(b"".join(int(t).to_bytes(4, "little") for t in ids))
    return h.hexdigest()[:16]
