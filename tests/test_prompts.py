"""Named prompt sets: the stdlib training headers and the HumanEval benchmark prompts."""

from __future__ import annotations

import ast
import random
import textwrap

import pytest

from acchead.errors import AccheadError
from acchead.zoo import prompts
from acchead.zoo.prompts import (
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
        "stdlib-functions", "stdlib-heldout-functions", "stdlib-function-bodies", "humaneval"
    }
    known = "known sets: stdlib-functions, stdlib-heldout-functions, stdlib-function-bodies, humaneval"
    with pytest.raises(AccheadError, match=known):
        load_prompt_set("mbpp")
    with pytest.raises(AccheadError, match="limit"):
        load_prompt_set("humaneval", limit=-1)
