"""The demo corpus: the running interpreter's standard-library source, split into LM-train and held-out files.

The split is a pure function of the relative file paths (a hash), so every machine with the same Python
version gets the same split without shipping a file list. The v2 pair's corpus adds installed packages'
source (`acchead.zoo.packages`, composed in `acchead.zoo.training_corpus`); the held-out files stay these.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from pathlib import Path

# Directories whose files are tests or generated tables, not ordinary library code.
_SKIP_PARTS = {"test", "tests", "idle_test", "site-packages", "__pycache__", "pydoc_data", "encodings"}
MAX_FILE_BYTES = 400_000  # a handful of huge generated modules would dominate a 3M-token corpus
NUM_HELDOUT_FILES = 40


def stdlib_dir() -> Path:
    """Directory of the running interpreter's pure-Python standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None) -> list[Path]:
    """All non-test `.py` files of the standard library, sorted by relative path."""
    root = root or stdlib_dir()
    out = []
    # The files of `root.rglob("*.py")` outside the skipped directories, found without walking into them
    # (site-packages alone may hold tens of thousands of files: seconds of the CLIs' start-up otherwise).
    # Like rglob, os.walk does not descend into symlinked directories.
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_PARTS]
        for name in filenames:
            if not name.endswith(".py") or name.startswith("test_"):
                continue
            path = Path(dirpath, name)
            if path.stat().st_size > MAX_FILE_BYTES:
                continue
            out.append(path)
    return sorted(out, key=lambda p: p.relative_to(root).as_posix())


def _rank(rel: str) -> str:
    return hashlib.sha1(rel.encode()).hexdigest()


def split_files(
    root: Path | None = None, num_heldout: int = NUM_HELDOUT_FILES
) -> tuple[list[Path], list[Path]]:
    """(train files, held-out files): the `num_heldout` files with the smallest path hash are held out."""
    root = root or stdlib_dir()
    files = stdlib_files(root)
    ranked = sorted(files, key=lambda p: _rank(p.relative_to(root).as_posix()))
    heldout = set(ranked[:num_heldout])
    return [f for f in files if f not in heldout], [f for f in files if f in heldout]


def read_source(path: Path) -> str | None:
    """File text, or None if it is not UTF-8 (a few stdlib files carry other encodings)."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None
