"""The third-party half of the v2 corpus: the Python source of a fixed list of installed packages.

Exactly the packages of `CORPUS_PACKAGES` enter (issue 21); no other third-party code does, which is why
each package contributes only its own import directory (not the other top-level modules its distribution
installs, e.g. torch's `torchgen`, matplotlib's `mpl_toolkits`) and why clearly marked vendored code inside
it is dropped. A package is found where the running interpreter would import it from
(`importlib.util.find_spec`, which does not import it: importing torch takes seconds), and its version is
its distribution's (`importlib.metadata`).

What a package contributes, precisely: every `.py` file under its import directory, except

- test code: any file under a directory named `test`, `tests`, `testing` or `_testing`, or whose name
  starts with `test_` or `test-` (accelerate's `test_utils`, sympy's `test-examples`); and any file
  whose stem is `conftest`, `testing`, `testing_utils`, `testutil(s)`, starts with `test_`, or ends with
  `_test` or `_tests` (torch's `_dynamo/testing.py`, transformers' `testing_utils.py`). `commands/test.py`
  (the `accelerate test` / `datasets test` commands) is library code and stays.
- vendored code: any file under a directory named `_vendor`, `vendor`, `vendored`, `_vendored`,
  `vendored_templates`, `third_party` or `_third_party`, and any file whose first 10 lines say
  "vendored from http(s)://..." (a whole file copied from another project, e.g. pandas'
  `util/version/__init__.py` from `packaging`). A vendored snippet inside an otherwise own file stays.
- files over the stdlib corpus's size cap (`corpus.MAX_FILE_BYTES`), empty files, and files that are not
  UTF-8 (the same rules the stdlib half follows).

Files are listed in the order of their path relative to the package's parent directory, so the list is
the same on every machine with the same package versions.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path

from acchead.demo_pair import MAX_FILE_BYTES
from acchead.errors import AccheadError


@dataclass(frozen=True)
class CorpusPackage:
    """One third-party package of the v2 corpus: its import name and its distribution's name."""

    module: str  # the import name, whose directory contributes its source
    distribution: str  # the name `importlib.metadata` knows it by (its version comes from there)


# The list, in this order (the order decides which copy of a duplicated file is kept).
CORPUS_PACKAGES: tuple[CorpusPackage, ...] = (
    CorpusPackage("torch", "torch"),
    CorpusPackage("transformers", "transformers"),
    CorpusPackage("numpy", "numpy"),
    CorpusPackage("sympy", "sympy"),
    CorpusPackage("networkx", "networkx"),
    CorpusPackage("pandas", "pandas"),
    CorpusPackage("matplotlib", "matplotlib"),
    CorpusPackage("lightning", "lightning"),
    CorpusPackage("pytorch_lightning", "pytorch-lightning"),
    CorpusPackage("accelerate", "accelerate"),
    CorpusPackage("torchmetrics", "torchmetrics"),
    CorpusPackage("datasets", "datasets"),
    CorpusPackage("huggingface_hub", "huggingface-hub"),
)

_TEST_DIRS = {"test", "tests", "testing", "_testing"}
_TEST_DIR_PREFIXES = ("test_", "test-")
_TEST_STEM = re.compile(r"^(conftest|testing|testing_utils|testutils?|test_.*|.*_tests?)$")
_VENDORED_DIRS = {"_vendor", "vendor", "vendored", "_vendored", "vendored_templates", "third_party",
                  "_third_party"}
_VENDORED_HEADER = re.compile(r"vendored from https?://", re.IGNORECASE)
_HEADER_LINES = 10
_NEVER_ENTER = {"__pycache__"}


@dataclass(frozen=True)
class InstalledPackage:
    """Where a corpus package is installed here, and which version."""

    package: CorpusPackage
    root: Path  # the import directory, e.g. .../site-packages/torch
    version: str

    @property
    def name(self) -> str:
        return self.package.module


def locate(package: CorpusPackage) -> InstalledPackage | None:
    """The installed copy of `package` the running interpreter would import, or None if it has none."""
    try:
        spec = importlib.util.find_spec(package.module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:  # absent, or a single module, not a package
        return None
    try:
        version = importlib.metadata.version(package.distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    return InstalledPackage(package, Path(next(iter(spec.submodule_search_locations))), version)


def locate_all(packages: tuple[CorpusPackage, ...] = CORPUS_PACKAGES) -> list[InstalledPackage]:
    """Every package of `packages`, installed; a one-line error naming the missing ones otherwise.

    A missing package is an error rather than a smaller corpus: the pair would otherwise be trained on a
    corpus its report does not describe, and two machines would build different pairs from one command.
    """
    found = {p.module: locate(p) for p in packages}
    missing = [p for p in packages if found[p.module] is None]
    if missing:
        names = ", ".join(f"{p.module} (pip: {p.distribution})" for p in missing)
        raise AccheadError(f"the v2 corpus needs these packages installed, and they are not: {names}")
    return [found[p.module] for p in packages]  # type: ignore[misc]  # none is None here


def is_test_dir(name: str) -> bool:
    """Whether a directory of this name holds test code (see the module docstring)."""
    return name in _TEST_DIRS or name.startswith(_TEST_DIR_PREFIXES)


def is_test_file(name: str) -> bool:
    """Whether a `.py` file of this name is test code (see the module docstring)."""
    return bool(_TEST_STEM.match(name.removesuffix(".py")))


def is_vendored_file(path: Path) -> bool:
    """Whether the file's first lines say it was copied whole from another project's URL."""
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            head = "".join(line for _, line in zip(range(_HEADER_LINES), f, strict=False))
    except OSError:
        return False
    return bool(_VENDORED_HEADER.search(head))


def package_files(root: Path, max_bytes: int = MAX_FILE_BYTES) -> list[Path]:
    """The `.py` files under `root` that the corpus takes (module docstring), sorted by relative path.

    Non-UTF-8 files are left to the reader (`corpus.read_source` returns None for them), as in the stdlib.
    """
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        # Pruned in place: os.walk never descends into tests or vendored trees (torch's alone: ~1,000 files).
        dirnames[:] = [d for d in dirnames
                       if d not in _NEVER_ENTER and d not in _VENDORED_DIRS and not is_test_dir(d)]
        for name in filenames:
            if not name.endswith(".py") or is_test_file(name):
                continue
            path = Path(dirpath, name)
            size = path.stat().st_size
            if size == 0 or size > max_bytes or is_vendored_file(path):
                continue
            out.append(path)
    return sorted(out, key=lambda p: p.relative_to(root).as_posix())
