"""Named prompt sets: the stdlib training headers and the HumanEval benchmark prompts."""

from __future__ import annotations

import ast
import json
import random
import sys
import textwrap
from pathlib import Path

import pytest

from acchead import prompt_sets as prompts
from acchead.cache import cache_dir
from acchead.errors import AccheadError
from acchead.prompt_sets import (
    MAX_PROMPT_CHARS,
    _function_bodies,
    _function_headers,
    list_prompt_sets,
    load_prompt_set,
)


def test_function_headers_cut_after_the_docstring():
    source = textwrap.dedent('''
        import os

        @decorator
        def top(a, b=1):
            """Top level.

        Continuation at column 0.
            """
            return a

        class C:
            async def method(self):
                """Indented."""
                pass

            def undocumented(self):
                return 1

            def one_liner(self): "doc"
    ''')
    assert _function_headers(source) == [
        'def top(a, b=1):\n    """Top level.\n\nContinuation at column 0.\n    """\n',
        'async def method(self):\n    """Indented."""\n',
    ]
    assert _function_headers("def broken(:\n") == []


def test_function_bodies_cut_after_a_body_statement_leaving_two():
    source = textwrap.dedent('''
        class C:
            def method(self, x):
                """Doc."""
                a = 1
                if x:
                    a = 2
                b = a + 1
                return b

            def short(self):
                a = 1
                return a

            def one_line(self): return 1
    ''')
    cuts = set()
    for seed in range(40):
        got = _function_bodies(source, random.Random(seed))
        assert len(got) == 1  # `short` has 2 statements, `one_line` is one line: neither can be cut
        cuts.add(got[0])
    head = 'def method(self, x):\n    """Doc."""\n    a = 1\n'
    # The docstring is never the cut; the cut is after statement 1 or 2 of 4 (>= 2 left to write).
    assert cuts == {head, head + "    if x:\n        a = 2\n"}
    assert _function_bodies("def broken(:\n", random.Random(0)) == []


def test_stdlib_function_bodies():
    bodies = load_prompt_set("stdlib-function-bodies")
    assert len(bodies) > 3000  # ~5,700 on CPython 3.11
    assert len(set(bodies)) == len(bodies) and not set(bodies) & set(load_prompt_set("stdlib-functions"))
    assert all(p.endswith("\n") and len(p) <= MAX_PROMPT_CHARS for p in bodies)
    assert all(p.startswith(("def ", "async def ")) for p in bodies)
    assert load_prompt_set("stdlib-function-bodies") == bodies  # repeatable


def test_stdlib_functions():
    prompts = load_prompt_set("stdlib-functions")
    assert len(prompts) > 3000  # ~6,000 on CPython 3.11
    assert len(set(prompts)) == len(prompts)
    assert all(p.endswith("\n") and len(p) <= MAX_PROMPT_CHARS for p in prompts)
    assert all(p.startswith(("def ", "async def ")) for p in prompts)
    # Each is a syntactically complete header + docstring: adding a body makes it parse.
    for p in prompts[:200]:
        ast.parse(p + "    pass\n")
    # A prefix is a shuffled sample, not one module's functions in source order.
    assert load_prompt_set("stdlib-functions", limit=50) == prompts[:50]
    assert len({p.split("(")[0] for p in prompts[:50]}) > 40


def test_stdlib_functions_come_from_lm_train_files_only(tmp_path, monkeypatch):
    train, heldout = tmp_path / "train.py", tmp_path / "heldout.py"
    train.write_text('def seen(x):\n    """In the LM-train split."""\n    return x\n')
    heldout.write_text('def unseen(x):\n    """Held out from LM training."""\n    return x\n')
    monkeypatch.setattr(prompts, "split_files", lambda: ([train], [heldout]))
    assert load_prompt_set("stdlib-functions") == ['def seen(x):\n    """In the LM-train split."""\n']
    unseen = 'def unseen(x):\n    """Held out from LM training."""\n'
    assert load_prompt_set("stdlib-heldout-functions") == [unseen]


def test_heldout_functions_share_no_prompt_with_the_training_prompts(tmp_path, monkeypatch):
    train, heldout = tmp_path / "a.py", tmp_path / "b.py"
    same = 'def same(x):\n    """Trivial and everywhere."""\n    return x\n'
    train.write_text(same)
    heldout.write_text(same + 'def other(x):\n    """Only here."""\n    return x\n')
    monkeypatch.setattr(prompts, "split_files", lambda: ([train], [heldout]))
    assert load_prompt_set("stdlib-heldout-functions") == ['def other(x):\n    """Only here."""\n']


def test_humaneval():
    prompts = load_prompt_set("humaneval")
    assert len(prompts) == 164
    assert "def has_close_elements(" in prompts[0]
    assert all(p.endswith("\n") for p in prompts)
    assert not set(prompts) & set(load_prompt_set("stdlib-functions"))
    assert load_prompt_set("humaneval", limit=3) == prompts[:3]


def test_unknown_name_and_bad_limit():
    assert set(list_prompt_sets()) == {
        "stdlib-functions", "stdlib-heldout-functions", "stdlib-function-bodies", "humaneval",
        "mtbench", "sharegpt", "sharegpt-heldout",
    }  # fmt: skip
    known = "known sets: stdlib-functions, stdlib-heldout-functions, stdlib-function-bodies, humaneval, mtb"
    with pytest.raises(AccheadError, match=known):
        load_prompt_set("mbpp")
    with pytest.raises(AccheadError, match="limit"):
        load_prompt_set("humaneval", limit=-1)


def _never_built():
    raise AssertionError("built again instead of read from the cache")


def test_a_cached_stdlib_set_is_the_built_set(tmp_path, monkeypatch):
    """The second load reads the cache file (nothing is built), and it holds the built set exactly."""
    monkeypatch.setenv("ACCHEAD_CACHE_DIR", str(tmp_path))
    name = "stdlib-functions"
    built = list(prompts._PROMPT_SETS[name][1]())  # the building code, never the cache
    assert load_prompt_set(name) == built  # built, and written to the cache
    path = prompts.cache_path(name, prompts.cache_key(name))
    assert path.parent == tmp_path / "prompts" and path.is_file()
    monkeypatch.setitem(prompts._PROMPT_SETS, name, ("", _never_built))
    assert load_prompt_set(name) == built
    assert load_prompt_set(name, limit=7) == built[:7]


def test_a_changed_key_or_a_bad_cache_file_rebuilds(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ACCHEAD_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "mod.py"
    src.write_text('def f(x):\n    """One."""\n    return x\n')
    monkeypatch.setattr(prompts, "split_files", lambda: ([src], []))
    monkeypatch.setattr(prompts, "_stdlib_functions", prompts._stdlib_functions.__wrapped__)  # no memo
    name, builds = "stdlib-functions", []
    desc, build = prompts._PROMPT_SETS[name]
    monkeypatch.setitem(prompts._PROMPT_SETS, name, (desc, lambda: builds.append(1) or build()))

    def load() -> list[str]:
        return load_prompt_set(name)

    assert load() == load() == ['def f(x):\n    """One."""\n'] and len(builds) == 1  # then read back
    # The corpus: its files' paths, sizes and mtimes are in the key.
    src.write_text('def f(x):\n    """Two, longer."""\n    return x\n')
    two = ['def f(x):\n    """Two, longer."""\n']
    assert load() == load() == two and len(builds) == 2
    # The definition: the source of prompt_sets.py and of the split, demo_pair.py (here an edited copy),
    # and CACHE_FORMAT.
    edited = tmp_path / "demo_pair.py"
    edited.write_text(Path(prompts.demo_pair.__file__).read_text() + "# edited\n")
    monkeypatch.setattr(prompts.demo_pair, "__file__", str(edited))
    assert load() == load() == two and len(builds) == 3
    monkeypatch.setattr(prompts, "CACHE_FORMAT", prompts.CACHE_FORMAT + 1)
    assert load() == load() == two and len(builds) == 4
    # The interpreter.
    monkeypatch.setattr(sys, "version", sys.version + " (another build)")
    assert load() == load() == two and len(builds) == 5
    # A corrupt, truncated or foreign cache file is rebuilt, silently, and replaced.
    path = prompts.cache_path(name, prompts.cache_key(name))
    for bad in (b'{"key": ', b"\xff\xfe\x00", b"[1, 2]", b'{"key": {}, "value": ["x"]}'):
        path.write_bytes(bad)
        assert load() == two and json.loads(path.read_text())["value"] == two
    assert len(builds) == 9 and capsys.readouterr().err == ""


def test_an_unwritable_cache_still_gives_the_set(tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("not a directory")
    monkeypatch.setenv("ACCHEAD_CACHE_DIR", str(tmp_path / "file"))
    src = tmp_path / "mod.py"
    src.write_text('def f(x):\n    """One."""\n    return x\n')
    monkeypatch.setattr(prompts, "split_files", lambda: ([src], []))
    assert load_prompt_set("stdlib-functions") == ['def f(x):\n    """One."""\n']
    assert "cannot write the cache file" in capsys.readouterr().err


def test_cache_dir(monkeypatch, tmp_path):
    for var in ("ACCHEAD_CACHE_DIR", "ACCHEAD_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "acchead"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "acchead"
    monkeypatch.setenv("ACCHEAD_CACHE", str(tmp_path / "mag"))  # the older name, still read
    assert cache_dir() == tmp_path / "mag"
    monkeypatch.setenv("ACCHEAD_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"
