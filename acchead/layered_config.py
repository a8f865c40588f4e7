"""Settings of a command merged from three layers: the shipped YAML, a `--config` YAML, the command line.

Every command with a config file (`acchead-gen-data`, `acchead-train`, `acchead-sweep`, `acchead-bench`)
resolves its settings the same way, here:

1. the shipped file `configs/<command>.yaml` (every key, each with a comment);
2. the user's `--config` file, which may set only some keys: the others keep the shipped values;
3. the flags given on the command line.

A later layer overrides an earlier one key by key; `None` means "not set" in every layer (a YAML `null`, a
flag left out), so it never hides a value below it. A nested mapping (the bench's `goals:`) merges key by
key too. An *exclusive group* is a set of keys of which one choice is made (gen-data's prompt source: a
prompt set, a file, a dataset or responses): a layer that sets any key of the group replaces the whole
group below it, so `--prompts FILE` is not reported as a second source beside the shipped prompt set.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from acchead.errors import AccheadError


def read_mapping(path: str | Path) -> dict[str, Any]:
    """A YAML file holding a mapping, as a dict (an empty file is `{}`).

    AccheadError, one line, for a missing file, invalid YAML or a file that is not a mapping.
    """
    path = Path(path).expanduser()
    if path.is_dir():
        raise AccheadError(f"config file {path} is a directory: give a YAML file")
    if not path.is_file():
        raise AccheadError(f"config file does not exist: {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, ValueError, yaml.YAMLError) as e:  # ValueError: not UTF-8
        raise AccheadError(f"{path} is not valid YAML: {str(e).splitlines()[0]}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise AccheadError(f"{path} must hold a mapping of setting names to values")
    return data


def check_known(cfg: Mapping[str, Any], known: Collection[str], where: str | Path) -> None:
    """AccheadError naming every key of `cfg` (read from `where`) that is not in `known`."""
    unknown = sorted(set(cfg) - set(known))
    if unknown:
        raise AccheadError(f"{where}: unknown keys {', '.join(unknown)}")


_TYPE_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string", list: "a list",
               tuple: "a list", dict: "a mapping"}  # fmt: skip


def check_types(cfg: Mapping[str, Any], accepted: Mapping[str, tuple[type, ...]], where: str | Path) -> None:
    """AccheadError naming the first key of `cfg` (read from `where`) whose value is none of its `accepted`
    types: a YAML `true` is no integer (`overwrite: "false"` would otherwise read as true, `max_new_tokens:
    true` as 1), an integer is a number. Null values and keys outside `accepted` are not checked."""
    for key, value in cfg.items():
        kinds = accepted.get(key)
        if value is None or not kinds:
            continue
        if isinstance(value, bool):
            ok = bool in kinds
        elif isinstance(value, int):
            ok = int in kinds or float in kinds
        else:
            ok = isinstance(value, kinds)
        if not ok:
            names = " or ".join(dict.fromkeys(_TYPE_NAMES.get(k, k.__name__) for k in kinds))
            raise AccheadError(f"{where}: {key} must be {names}, got {value!r}")


def field_types(cls: type) -> dict[str, tuple[type, ...]]:
    """Each field of the dataclass `cls` -> the YAML types its annotation accepts (`int | None` -> (int,),
    `tuple[float, float]` -> (list, tuple)); a field annotated `Any` is left out."""
    out: dict[str, tuple[type, ...]] = {}
    for name, hint in typing.get_type_hints(cls).items():
        union = isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union
        members = [typing.get_origin(a) or a for a in (typing.get_args(hint) if union else (hint,))]
        if Any in members:
            continue
        kinds = [k for m in members if m is not type(None) for k in ((list, tuple) if m is tuple else (m,))]
        out[name] = tuple(kinds)
    return out


def merge_layers(
    layers: Iterable[Mapping[str, Any]], exclusive: Iterable[Collection[str]] = ()
) -> dict[str, Any]:
    """The layers merged, later over earlier (see the module docstring); None values are skipped.

    `exclusive`: groups of keys of which a layer setting one replaces the group of the layers below.
    """
    groups = [set(g) for g in exclusive]
    merged: dict[str, Any] = {}
    for layer in layers:
        given = {k: v for k, v in layer.items() if v is not None}
        for group in groups:
            if group & set(given):
                merged = {k: v for k, v in merged.items() if k not in group}
        for key, value in given.items():
            below = merged.get(key)
            if isinstance(value, Mapping) and isinstance(below, Mapping):
                value = merge_layers([below, value])
            merged[key] = dict(value) if isinstance(value, Mapping) else value
    return merged


def resolve_layers(
    shipped: Path,
    user: str | Path | None,
    flags: Mapping[str, Any],
    known: Collection[str],
    exclusive: Iterable[Collection[str]] = (),
    convert: Callable[[Path, dict[str, Any]], dict[str, Any]] | None = None,
    accepted: Mapping[str, tuple[type, ...]] | None = None,
) -> dict[str, Any]:
    """The shipped file, the `--config` file `user` (None: none given) and the command line's `flags`
    merged; AccheadError for an unreadable file, a key of either file outside `known` or a value of a type
    its key does not take (`accepted`, `check_types`; the flags' parsers type theirs).

    `convert(path, cfg)`, if given, turns each file's values into what the flags' parsers produce (the
    bench's comma-separated lists), so that all three layers hold values of one type.
    """
    files = [shipped] + ([Path(user).expanduser()] if user else [])
    layers = []
    for path in files:
        cfg = read_mapping(path)
        check_known(cfg, known, path)
        check_types(cfg, accepted or {}, path)
        layers.append(convert(path, cfg) if convert else cfg)
    return merge_layers([*layers, flags], exclusive)
