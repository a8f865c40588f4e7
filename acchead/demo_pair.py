"""The demo pair as data: where its models and shipped heads are, which head is the default under an S, and
the stdlib split its corpus is made of.

Why a core module apart from `acchead.zoo`: the zoo is the pair's builder (2.3k lines: architectures,
corpora, distillation, reports), and the core, gen-data, training and the decoders must not depend on it
(issue 31). What the commands need of the pair is small and lives here: the paths of the shipped files
(package data under `acchead/zoo/`, read by path: no module of `acchead.zoo` is imported), the per-S head
look-up, and the stdlib LM-train/held-out split (the demo corpus, also MaG's bigram corpus). `acchead.zoo`
re-exports these names instead of keeping copies.

Which head a command uses is resolved at its command line (`acchead-decode`, `acchead-bench`, the
`generate` integration), never in `SpeculativeDecoder`. From Python, on the demo pair:

    SpeculativeDecoder(target, draft, policy="specdecpp", head=head_for(SamplingConfig(0.0)))

Shipped heads live in `heads/<name>/head.safetensors`, one directory per (sampling configuration S, head
kind); `heads/defaults.json` maps each S (its `str`, e.g. "greedy") to the default head's directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import sysconfig
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:

    from acchead.sampling import SamplingConfig

ZOO_DIR = Path(__file__).resolve().parent / "zoo"
DRAFT_DIR = ZOO_DIR / "pycode-draft"
TARGET_DIR = ZOO_DIR / "pycode-target"
HEADS_DIR = ZOO_DIR / "heads"
DEFAULTS_FILE = HEADS_DIR / "defaults.json"

# ------------------------------------------------------------------------------------------ shipped heads


def shipped_heads(sampling: SamplingConfig | None = None, heads_dir: Path = HEADS_DIR) -> list[Path]:
    """Every head file shipped in `heads_dir` (the demo pair's by default), sorted by directory name; with
    `sampling`, only the heads whose labels were computed under that S (a head predicts acceptance under
    its own S only)."""
    from acchead.head_io import read_head_metadata

    paths = sorted(heads_dir.glob("*/head.safetensors"))
    if sampling is None:
        return paths
    return [p for p in paths if read_head_metadata(p).sampling_config == sampling]


def default_head(sampling: SamplingConfig, heads_dir: Path = HEADS_DIR) -> Path | None:
    """The head shipped in `heads_dir` that the commands use by default under S, or None if none was
    trained under S.

    `heads_dir/defaults.json` names one per shipped S; an S it does not name falls back to the first shipped
    head trained under that S, else None (the caller then warns and uses the greedy default, or needs one).
    """
    defaults = heads_dir / DEFAULTS_FILE.name
    if defaults.is_file():
        name = json.loads(defaults.read_text()).get(str(sampling))
        if name and (heads_dir / name / "head.safetensors").is_file():
            return heads_dir / name / "head.safetensors"
    matches = shipped_heads(sampling, heads_dir)
    return matches[0] if matches else None


def fallback_head() -> Path:
    """The head used when no shipped head matches the requested S: the greedy default."""
    from acchead.sampling import SamplingConfig

    head = default_head(SamplingConfig(0.0))
    if head is None:
        raise FileNotFoundError(f"no shipped head in {HEADS_DIR}")
    return head


def head_for(sampling: SamplingConfig) -> Path:
    """The demo pair's head for S: the shipped default under S, else the greedy default (the decoder then
    warns that the head's S differs). What `acchead-decode` uses without `--head`."""
    return default_head(sampling) or fallback_head()


# ------------------------------------------------------------------------------------ the stdlib corpus
# The running interpreter's standard-library source, split into LM-train and held-out files. The split is
# a pure function of the relative file paths (a hash), so every machine with the same Python version gets
# the same split without shipping a file list. The v2 pair's corpus adds installed packages' source
# (`acchead.zoo.packages`, composed in `acchead.zoo.training_corpus`); the held-out files stay these.

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
