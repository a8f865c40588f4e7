"""Prompts for the commands that decode many (the bench, `acchead-decode --prompts`): a named prompt set
(`acchead.prompt_sets`: code sets and the real pair's chat sets) or a JSON-lines file, and their token ids,
checked against (or cut to) the models' context."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from acchead.errors import AccheadError
from acchead.prompting import ChatPrompt

if TYPE_CHECKING:
    import torch


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


def encode_prompts(
    prompts: list[str], tok, target, draft, max_new_tokens: int, device: str, truncate: bool = False
) -> tuple[list[torch.Tensor], list[dict]]:
    """(1, T) ids per prompt, and the prompts cut to fit: `[{"prompt", "tokens", "kept"}]`.

    A prompt whose length + `max_new_tokens` exceeds either model's context is refused with one line, or,
    with `truncate` (`--truncate-prompts`), cut to its last tokens and listed (results.json records it).
    """
    import torch

    from acchead.models import check_prompt, context_length
    from acchead.prompting import encode_prompt, is_chat

    limits = [c for c in (context_length(target), context_length(draft)) if c is not None]
    limit = min(limits) if limits else 10**9
    keep = limit - max_new_tokens
    if keep < 1:
        raise AccheadError(f"--max-new-tokens {max_new_tokens} leaves no room in a {limit}-token context")
    out, truncated = [], []
    for i, p in enumerate(prompts):
        # chat prompts through the chat template; raw ones as the bench always encoded them
        if is_chat(p):
            ids = torch.tensor([encode_prompt(tok, p)])
        else:
            ids = tok(p, return_tensors="pt", add_special_tokens=False).input_ids
        if ids.shape[1] == 0:
            raise AccheadError(f"prompt {i} encodes to zero tokens")
        if ids.shape[1] > keep:
            if not truncate:
                raise AccheadError(
                    f"prompt {i} has {ids.shape[1]} tokens: with --max-new-tokens {max_new_tokens} it "
                    f"exceeds the {limit}-token context; --truncate-prompts keeps its last {keep} tokens"
                )
            truncated.append({"prompt": i, "tokens": int(ids.shape[1]), "kept": keep})
            ids = ids[:, -keep:]
        check_prompt(ids[0], max_new_tokens, [target, draft])  # ids outside a model's vocabulary
        out.append(ids.to(device))
    return out, truncated
