"""Prompts for the bench: a named prompt set (`acchead.prompt_sets`: code sets and the real pair's chat sets)
or a JSON-lines file."""

from __future__ import annotations

import json
from pathlib import Path

from acchead.errors import AccheadError
from acchead.prompting import ChatPrompt


def _looks_like_file(source: str) -> bool:
    return source.endswith((".jsonl", ".json")) or "/" in source or Path(source).exists()


def read_jsonl_prompts(path: Path, field: str = "prompt") -> list[str]:
    """The `field` string of every non-blank line of a JSON-lines file, in file order (a `ChatPrompt` where
    the line says `"chat": true`)."""
    if not path.is_file():
        raise AccheadError(f"prompt file does not exist: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise AccheadError(f"prompt file {path} is not UTF-8 text (byte {e.start})") from None
    prompts = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise AccheadError(f"{path}:{n}: not a JSON object") from None
        if not isinstance(row, dict) or field not in row:
            raise AccheadError(f"{path}:{n}: no {field!r} field")
        if not isinstance(row[field], str) or not row[field]:
            raise AccheadError(f"{path}:{n}: {field!r} must be a non-empty string")
        if not isinstance(row.get("chat", False), bool):
            raise AccheadError(f'{path}:{n}: "chat" must be true or false')
        prompts.append(ChatPrompt(row[field]) if row.get("chat") else row[field])
    if not prompts:
        raise AccheadError(f"{path}: no prompts")
    return prompts


def load_prompts(source: str, limit: int = 0) -> list[str]:
    """Prompts from a set name (`humaneval`, `stdlib-functions`) or a `.jsonl` path; the first `limit`.

    `limit` 0 means all prompts.
    """
    if _looks_like_file(source):
        prompts = read_jsonl_prompts(Path(source).expanduser())
        return prompts[:limit] if limit else prompts
    from acchead.prompt_sets import load_prompt_set

    try:
        return load_prompt_set(source, limit=limit or None)
    except KeyError:
        raise AccheadError(
            f"unknown prompt set {source!r} (a name such as humaneval, or a .jsonl file)"
        ) from None
