"""Settings merged from the shipped YAML, a `--config` YAML and the flags (`acchead.layered_config`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from acchead.errors import AccheadError
from acchead.layered_config import check_types, field_types, merge_layers, read_mapping, resolve_layers


def test_later_layers_override_key_by_key_and_none_is_not_set():
    merged = merge_layers([{"a": 1, "b": 2, "c": 3}, {"b": 20, "c": None}, {"a": None, "d": 4}])
    assert merged == {"a": 1, "b": 20, "c": 3, "d": 4}


def test_nested_mappings_merge_key_by_key():
    shipped = {"goals": {"ratio": 0.2, "gap": 0.35}, "k": [1, 2]}
    merged = merge_layers([shipped, {"goals": {"gap": 0.5}, "k": [3]}])
    assert merged == {"goals": {"ratio": 0.2, "gap": 0.5}, "k": [3]}  # lists are replaced, not merged
    assert shipped["goals"] == {"ratio": 0.2, "gap": 0.35}  # the layers themselves are not changed


def test_an_exclusive_group_is_replaced_by_the_layer_that_sets_it():
    group = ("prompt_set", "prompts")
    shipped = {"prompt_set": "stdlib", "seed": 0}
    assert merge_layers([shipped, {"prompts": "p.jsonl"}], [group]) == {"prompts": "p.jsonl", "seed": 0}
    # A layer that sets no key of the group leaves the group below it alone.
    assert merge_layers([shipped, {"seed": 3}], [group]) == {"prompt_set": "stdlib", "seed": 3}
    # Without the group both keys would survive (two sources).
    assert merge_layers([shipped, {"prompts": "p.jsonl"}]) == {"prompt_set": "stdlib", "prompts": "p.jsonl",
                                                               "seed": 0}  # fmt: skip


def test_resolve_layers_reads_both_files_and_checks_their_keys(tmp_path):
    shipped = tmp_path / "shipped.yaml"
    shipped.write_text("a: 1  # a comment\nb: 2\nc: null\n")
    user = tmp_path / "user.yaml"
    user.write_text("b: 5\n")
    known = {"a", "b", "c"}
    assert resolve_layers(shipped, None, {"a": None}, known) == {"a": 1, "b": 2}
    assert resolve_layers(shipped, user, {"a": 7}, known) == {"a": 7, "b": 5}

    def tenfold(path, cfg):
        return {k: v * 10 for k, v in cfg.items() if v}

    converted = resolve_layers(shipped, user, {}, known, convert=tenfold)
    assert converted == {"a": 10, "b": 50}
    user.write_text("b: 5\nwarp: 9\nzap: 1\n")
    with pytest.raises(AccheadError, match=r"user\.yaml: unknown keys warp, zap"):
        resolve_layers(shipped, user, {}, known)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "config file does not exist"),
        ("a: [1\n", "is not valid YAML"),
        ("- 1\n", "must hold a mapping"),
    ],
)
def test_unreadable_files_are_one_line_errors(tmp_path, text, message):
    path = tmp_path / "c.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(AccheadError, match=message) as e:
        read_mapping(path)
    assert "\n" not in str(e.value)


def test_an_empty_file_is_an_empty_mapping(tmp_path):
    (tmp_path / "empty.yaml").write_text("# nothing\n")
    assert read_mapping(tmp_path / "empty.yaml") == {}


@dataclasses.dataclass
class _Knobs:
    n: int
    x: float | None
    flag: bool
    pair: tuple[float, float]
    free: Any


def test_values_are_checked_against_the_types_their_keys_take(tmp_path):
    """A YAML `true` is no integer and "false" no boolean; an integer is a number; null is always unset."""
    accepted = field_types(_Knobs)
    assert accepted == {"n": (int,), "x": (float,), "flag": (bool,), "pair": (list, tuple)}
    check_types({"n": 3, "x": 2, "flag": False, "pair": [1, 2], "free": object(), "other": "s", "n2": None},
                accepted, "f.yaml")  # fmt: skip
    cases = [({"n": True}, "n must be an integer, got True"), ({"n": 2.5}, "n must be an integer"),
             ({"x": "1e-3"}, "x must be a number"), ({"flag": "false"}, "flag must be true or false"),
             ({"pair": 0.9}, "pair must be a list")]  # fmt: skip
    for bad, message in cases:
        with pytest.raises(AccheadError, match=f"f.yaml: {message}"):
            check_types(bad, accepted, "f.yaml")
    shipped = tmp_path / "s.yaml"
    shipped.write_text("n: 'x'\n")
    with pytest.raises(AccheadError, match="n must be an integer"):
        resolve_layers(shipped, None, {}, {"n"}, accepted=accepted)


def test_a_directory_given_as_the_config_file_is_named_so(tmp_path):
    with pytest.raises(AccheadError, match="is a directory: give a YAML file"):
        read_mapping(tmp_path)
