"""The package layout: one import name, the stage dependency rule (DESIGN §1), and no import cycles.

The modules are read with `ast`, not imported, and the import graph counts every import statement of a
module (those inside functions too: a lazy import hides a cycle, it does not remove it), except those under
`if TYPE_CHECKING:`, which never run. Folders map onto module names as `pyproject.toml` installs them.
"""

from __future__ import annotations

import ast
import fnmatch
import re
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]
PACKAGES: list[str] = SETUPTOOLS["packages"]
PACKAGE_DIR: dict[str, str] = SETUPTOOLS.get("package-dir", {})
STAGES = ("acchead.data_gen", "acchead.train", "acchead.inference", "acchead.distill")
BENCH = "acchead.inference.bench"  # measures the decoders; they never import it
# The repository-root folders, by the top-level names they must never be imported under.
OLD_NAMES = {"data_gen", "train", "inference", "configs"}
# The demo pair's builder (issue 31): the core (acchead/*.py) and the stages import none of it; what the
# commands need of the pair (paths, shipped heads per S, the stdlib split) is the core's `acchead.demo_pair`.
ZOO = "acchead.zoo"


def package_folder(package: str) -> Path:
    """The source folder of `package` under pyproject's package-dir (longest mapped prefix wins)."""
    parts = package.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in PACKAGE_DIR:
            return REPO / PACKAGE_DIR[prefix] / Path(*parts[n:])
    return REPO / PACKAGE_DIR.get("", ".") / Path(*parts)


def modules() -> dict[str, Path]:
    """Every installed module name -> its source file (a package's own name -> its __init__.py)."""
    out = {}
    for package in PACKAGES:
        for path in sorted(package_folder(package).glob("*.py")):
            out[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return out


MODULES = modules()


def _runtime_imports(tree: ast.Module):
    """Import nodes anywhere in `tree` except under `if TYPE_CHECKING:`."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def imported_names(module: str, path: Path, runtime_only: bool = True) -> set[str]:
    """Absolute names of everything `module` imports: modules, and `from X import Y` as X.Y when a module.

    `runtime_only=False` also counts the imports under `if TYPE_CHECKING:`."""
    names = set()
    tree = ast.parse(path.read_text(), str(path))
    every = (n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom))
    for node in _runtime_imports(tree) if runtime_only else every:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:  # relative: resolve against the importing module's package
            package = module if path.name == "__init__.py" else module.rpartition(".")[0]
            anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            base = f"{anchor}.{base}" if base else anchor
        names.add(base)
        names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def graph() -> dict[str, set[str]]:
    """First-party import graph: module -> the modules of this project it imports."""
    return {m: {n for n in imported_names(m, p) if n in MODULES and n != m} for m, p in MODULES.items()}


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def stage_of(module: str) -> str | None:
    return next((s for s in STAGES if _in(module, s)), None)


def test_every_source_package_is_installed():
    """Every folder with an __init__.py under the mapped folders is in pyproject's package list."""
    for package in PACKAGES:
        assert (package_folder(package) / "__init__.py").is_file(), f"{package}: no {package_folder(package)}"
    roots = {package_folder(p) for p in PACKAGES if p.count(".") <= 1}
    found = {init.parent for root in roots for init in root.rglob("__init__.py")}
    missing = sorted(str(f.relative_to(REPO)) for f in found - {package_folder(p) for p in PACKAGES})
    assert not missing, f"folders with __init__.py that pyproject does not install: {missing}"


def test_one_top_level_name():
    """Installed under `acchead` only, and no module or test imports the root folders as top-level names."""
    assert {p.split(".")[0] for p in PACKAGES} == {"acchead"}
    assert all(target.split(".")[0] == "acchead" for target in PYPROJECT["project"]["scripts"].values())
    files = [(m, p) for m, p in MODULES.items()]
    files += [(f"tests.{p.stem}", p) for p in sorted((REPO / "tests").glob("*.py"))]
    offenders = sorted(
        f"{path.relative_to(REPO)}: {name}"
        for module, path in files
        for name in imported_names(module, path)
        if name.split(".")[0] in OLD_NAMES
    )
    assert not offenders, f"imports of the old top-level names: {offenders}"


def test_console_scripts_name_a_main():
    """Every console script points at an installed module that defines its function (read, not imported)."""
    for script, target in PYPROJECT["project"]["scripts"].items():
        module, _, func = target.partition(":")
        assert module in MODULES, f"{script}: no module {module}"
        tree = ast.parse(MODULES[module].read_text())
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert func in defined, f"{script}: {module} defines no {func}()"


def test_dependency_rule():
    """The core of `acchead` imports no stage, no stage imports another (DESIGN §1), and the decoders do
    not import the benchmark that measures them."""
    bad = []
    for module, imports in graph().items():
        for target in imports:
            source_stage, target_stage = stage_of(module), stage_of(target)
            if target_stage is not None and source_stage != target_stage:
                bad.append(f"{module} -> {target}")
            if _in(target, BENCH) and not _in(module, BENCH):
                bad.append(f"{module} -> {target}")
    assert not bad, f"imports across the stage boundaries: {sorted(bad)}"


def zoo_imports(module: str, path: Path) -> set[str]:
    """The modules of `acchead.zoo` that `module` imports, anywhere in it (functions and `if TYPE_CHECKING:`
    included): `from acchead import zoo` counts as `acchead.zoo`."""
    found = set()
    for name in imported_names(module, path, runtime_only=False):
        if _in(name, ZOO):  # `from acchead.zoo.prompts import f` counts as its module, acchead.zoo.prompts
            found.add(name if name in MODULES else name.rpartition(".")[0])
    return found


def zoo_free_modules() -> dict[str, Path]:
    """The modules that must not import the zoo: the core's own files (acchead/*.py) and the data, training
    and inference stages (the bench included)."""
    core = package_folder("acchead")
    return {m: p for m, p in MODULES.items() if p.parent == core or any(_in(m, s) for s in STAGES)}


def test_zoo_import_scan_sees_every_form(tmp_path):
    source = (
        "from acchead import zoo\nimport acchead.zoo.arch\nfrom acchead.errors import AccheadError\n"
        "def f():\n    from acchead.zoo.prompts import load_prompt_set\n"
        "if TYPE_CHECKING:\n    from acchead.zoo import pairs\n"
        "from .zoo import demo\n"
    )
    path = tmp_path / "mod.py"
    path.write_text(source)
    assert zoo_imports("acchead.x", path) == {
        "acchead.zoo", "acchead.zoo.arch", "acchead.zoo.prompts", "acchead.zoo.pairs", "acchead.zoo.demo"
    }  # fmt: skip


def test_the_core_and_the_stages_do_not_import_the_zoo():
    """Issue 31: the demo-pair builder leaves the core. Which head or model a command uses by default is
    resolved at its command line from `acchead.demo_pair`, never by importing `acchead.zoo`."""
    checked = zoo_free_modules()
    assert "acchead.demo_pair" in checked and "acchead.inference.decoder" in checked
    assert not any(_in(m, ZOO) for m in checked)
    found = {(m, z) for m, p in checked.items() for z in zoo_imports(m, p)}
    bad = sorted(f"{m} -> {z}" for m, z in found)
    assert not bad, f"imports of the demo-pair builder (use acchead.demo_pair): {bad}"


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the directed graph as [a, b, ..., a], or None if it is acyclic (iterative DFS)."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    for root in sorted(edges):
        if root in state:
            continue
        path, iters = [root], [iter(sorted(edges[root]))]
        state[root] = 1
        while path:
            nxt = next(iters[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                iters.pop()
            elif state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                iters.append(iter(sorted(edges.get(nxt, ()))))
    return None


def test_find_cycle_finds_lazy_and_long_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    tree = ast.parse("import os\ndef f():\n    from pkg.x import y\nif TYPE_CHECKING:\n    import pkg.z\n")
    assert sorted(type(n).__name__ for n in _runtime_imports(tree)) == ["Import", "ImportFrom"]


def test_no_module_imports_in_a_circle():
    edges = graph()
    assert edges["acchead.inference.decoder"], "the graph lost its edges (a parsing bug?)"
    cycle = find_cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_import_acchead_stays_light():
    """`import acchead` loads neither transformers nor any stage."""
    code = (
        "import sys, acchead; heavy = [m for m in sys.modules if m.split('.')[0] == 'transformers' "
        f"or m.startswith({STAGES!r})]; print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    assert out.stdout.strip() == "[]"


HEAVY = ("torch", "transformers", "lightning", "accelerate", "datasets", "matplotlib")


@pytest.mark.parametrize("script", sorted(PYPROJECT["project"]["scripts"]))
def test_console_script_help_and_bad_flags_import_nothing_heavy(script):
    """`--help` and a bad flag answer before torch & co. are imported (seconds each on a 2-core box); run
    in a fresh interpreter, like the console script."""
    module, _, func = PYPROJECT["project"]["scripts"][script].partition(":")
    code = (
        f"import sys\nfrom {module} import {func}\ncodes = []\n"
        "for argv in (['--help'], ['--no-such-flag']):\n"
        "    try:\n"
        f"        {func}(argv)\n"
        "    except SystemExit as e:\n"
        "        codes.append(e.code)\n"
        f"print(codes, sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    assert out.stdout.strip().splitlines()[-1] == "[0, 2] []", f"{script}: {out.stdout[-300:]}"
    # each flag's help states its default once, and never as "None"
    flags = re.split(r"\n(?=  -)", out.stdout)
    doubled = [f.split()[0] for f in flags if "(default: None)" in f or len(re.findall(r"\(default", f)) > 1]
    assert not doubled, f"{script}: flags whose help states a default twice or as None: {doubled}"


# One concept per module (issue 34): a source module past this many lines is split, not grown.
MAX_MODULE_LINES = 400


def test_no_source_module_is_over_400_lines():
    long = {
        str(p.relative_to(REPO)): n
        for p in MODULES.values()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by concept): {long}"


def readme_layout(text: str) -> dict[str, list[str]]:
    """The README's layout block as {folder: the `*.py` names (globs allowed) its lines name}.

    A line whose first word ends in `/` opens a folder; its indentation (two spaces a level) says which
    folder holds it. Every `name.py` on a line belongs to the innermost folder open at that line."""
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    names: dict[str, list[str]] = {}
    stack: list[tuple[int, str]] = []  # (indent, folder path)
    for line in block.splitlines():
        if not line.strip():
            continue
        indent, first = len(line) - len(line.lstrip()), line.split()[0]
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if first.endswith("/"):
            folder = "/".join([*(f for _, f in stack[-1:]), first.rstrip("/")])
            stack.append((indent, folder))
            names.setdefault(folder, [])
            # a folder's own line may name modules too (`configs/ ... (__init__.py: ...)`)
        if stack:
            names[stack[-1][1]].extend(re.findall(r"[\w*]+\.py\b", line))
    return names


def test_readme_layout_parser_nests_folders():
    text = "## Layout\n```\npkg/  the package\n  a.py  x\n  sub/  inner\n    b.py, c_*.py  y\n  d.py\n```\n"
    assert readme_layout(text) == {"pkg": ["a.py", "d.py"], "pkg/sub": ["b.py", "c_*.py"]}


def test_readme_layout_names_every_module():
    """The README's tree has a line (or a name on a line) for every module, under its own folder."""
    tree = readme_layout((REPO / "README.md").read_text())
    missing = []
    for path in MODULES.values():
        folder = str(path.parent.relative_to(REPO))
        if not any(fnmatch.fnmatch(path.name, pattern) for pattern in tree.get(folder, [])):
            missing.append(str(path.relative_to(REPO)))
    assert not missing, f"README.md's layout does not name: {missing}"
