"""What each demo pair trains on, and that corpus tokenized: per source, resumably, with its accounting.

    corpus "stdlib"           (pair v1) the stdlib LM-train files of `corpus.split_files`, as they are
    corpus "stdlib+packages"  (pair v2) those, then each package of `packages.CORPUS_PACKAGES` in order,
                              deduplicated by file content across all of them

Both share the held-out set: the 40 held-out stdlib files of `corpus.split_files`, a function of the stdlib's
paths alone, so adding packages cannot move it. In the v2 corpus a file whose bytes equal an earlier
file's is dropped, the held-out files counting as earliest: a package's copy of a held-out stdlib module
never enters training, and of two equal files the stdlib's (then the earlier package's) is kept.
v1 is left exactly as it was built (its train files are not deduplicated), so `--pair v1` reproduces it.

`tokenize_corpus` writes one token array per source under `<work>/tokens/` (`<source>.npy` plus
`<source>.json`: files, bytes, tokens, and a digest of the files' paths and contents and of the tokenizer),
reusing any whose digest still matches, then the joined `train_ids.npy` / `heldout_ids.npy` and
`corpus.json` (the per-source accounting the pair report records), each written atomically and
`corpus.json` last. A killed run redoes at most the source it was in; a changed package or tokenizer redoes
only what it changes.
"""

from __future__ import annotations

import hashlib
import json
import platform
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from acchead.demo_pair import read_source, split_files, stdlib_dir
from acchead.errors import AccheadError
from acchead.rundir import atomic_write, atomic_write_json
from acchead.zoo.packages import CORPUS_PACKAGES, CorpusPackage, locate_all, package_files

if TYPE_CHECKING:
    import numpy as np

CORPORA = ("stdlib", "stdlib+packages")
HELDOUT = "heldout"  # the held-out source's name in `<work>/tokens/` and `corpus.json`
_TOKENIZE_BATCH = 64  # files per tokenizer call: the Rust tokenizer spreads a batch over the cores


@dataclass(frozen=True)
class Source:
    """The files one origin (the stdlib, or one package) contributes to a corpus, in corpus order."""

    name: str  # "stdlib", "heldout", or a package's import name
    version: str  # the Python version for the stdlib, the distribution's version for a package
    root: Path
    files: tuple[Path, ...]
    duplicates: int = 0  # files of this origin dropped because an earlier file had the same bytes

    def digest(self) -> str:
        """sha256 of the files' paths (relative to `root`) and contents: what the tokens depend on."""
        h = hashlib.sha256()
        for f in self.files:
            h.update(f.relative_to(self.root).as_posix().encode() + b"\0")
            h.update(hashlib.sha256(f.read_bytes()).digest())
        return h.hexdigest()


def _content_key(path: Path) -> bytes:
    return hashlib.sha256(path.read_bytes()).digest()


def train_sources(
    corpus: str, stdlib_root: Path | None = None, packages: tuple[CorpusPackage, ...] = CORPUS_PACKAGES
) -> list[Source]:
    """The LM-train sources of `corpus` (one of `CORPORA`), in corpus order (module docstring)."""
    if corpus not in CORPORA:
        raise AccheadError(f"unknown corpus {corpus!r}; known: {', '.join(CORPORA)}")
    root = stdlib_root or stdlib_dir()
    train, heldout = split_files(root)
    python = platform.python_version()
    if corpus == "stdlib":
        return [Source("stdlib", python, root, tuple(train))]
    seen = {_content_key(f) for f in heldout}
    origins = [("stdlib", python, root, train)]
    origins += [(p.name, p.version, p.root.parent, package_files(p.root)) for p in locate_all(packages)]
    out = []
    for name, version, base, files in origins:
        kept, dropped = [], 0
        for f in files:
            key = _content_key(f)
            if key in seen:
                dropped += 1
                continue
            if read_source(f) is None:  # not UTF-8: the tokenizer would skip it; count only what enters
                continue
            seen.add(key)
            kept.append(f)
        out.append(Source(name, version, base, tuple(kept), dropped))
    return out


def heldout_source(stdlib_root: Path | None = None) -> Source:
    """The 40 held-out stdlib files, the same for every corpus."""
    root = stdlib_root or stdlib_dir()
    return Source(HELDOUT, platform.python_version(), root, tuple(split_files(root)[1]))


def source_texts(sources: list[Source]) -> Iterator[str]:
    """The text of every readable file of `sources`, in corpus order (for training a tokenizer)."""
    for src in sources:
        for f in src.files:
            if (text := read_source(f)) is not None:
                yield text


def _tokenize_source(src: Source, tok, eos_id: int) -> tuple[np.ndarray, int]:
    """(ids of every file joined with EOS after each, bytes read): the v1 build's exact per-file ids."""
    import numpy as np
    from tqdm import tqdm

    chunks: list[np.ndarray] = []
    total_bytes = 0
    bar = tqdm(total=len(src.files), desc=f"tokenize {src.name}", unit="file")
    for i in range(0, len(src.files), _TOKENIZE_BATCH):
        texts = [t for f in src.files[i : i + _TOKENIZE_BATCH] if (t := read_source(f)) is not None]
        total_bytes += sum(len(t.encode("utf-8")) for t in texts)
        for ids in tok(texts)["input_ids"] if texts else []:
            chunks.append(np.asarray([*ids, eos_id], dtype=np.uint16))
        bar.update(min(_TOKENIZE_BATCH, len(src.files) - i))
    bar.close()
    return (np.concatenate(chunks) if chunks else np.zeros(0, np.uint16)), total_bytes


def _save_npy(path: Path, arr: np.ndarray) -> None:
    import numpy as np

    atomic_write(path, lambda tmp: np.save(tmp, arr))


def tokenize_corpus(
    work: Path, tok_dir: Path, sources: list[Source], heldout: Source
) -> tuple[np.ndarray, np.ndarray, dict]:
    """(train ids, held-out ids, accounting) as uint16 arrays joined with EOS; resumable (module docstring).

    The accounting is {"tokenizer": sha256, "train_tokens", "heldout_tokens", "sources": {name: {version,
    files, duplicates, bytes, tokens}}, "heldout": {...}}, also written to `<work>/corpus.json`.
    """
    import numpy as np
    from transformers import AutoTokenizer

    tok_sha = hashlib.sha256((tok_dir / "tokenizer.json").read_bytes()).hexdigest()
    tokens_dir = work / "tokens"
    tokens_dir.mkdir(parents=True, exist_ok=True)
    tok = None
    arrays: dict[str, np.ndarray] = {}
    accounts: dict[str, dict] = {}
    for src in [*sources, heldout]:
        digest = hashlib.sha256(f"{src.digest()}\0{tok_sha}".encode()).hexdigest()
        meta_path, ids_path = tokens_dir / f"{src.name}.json", tokens_dir / f"{src.name}.npy"
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else None
        if meta is None or meta.get("digest") != digest or not ids_path.exists():
            if tok is None:
                tok = AutoTokenizer.from_pretrained(tok_dir)
            ids, n_bytes = _tokenize_source(src, tok, tok.eos_token_id)
            _save_npy(ids_path, ids)
            meta = {"digest": digest, "version": src.version, "files": len(src.files),
                    "duplicates": src.duplicates, "bytes": n_bytes, "tokens": len(ids)}
            atomic_write_json(meta_path, meta, sort_keys=False)  # after the ids: it vouches for them
        arrays[src.name] = np.load(ids_path)
        accounts[src.name] = {k: v for k, v in meta.items() if k != "digest"}
    train = np.concatenate([arrays[s.name] for s in sources])
    held = arrays[heldout.name]
    _save_npy(work / "train_ids.npy", train)
    _save_npy(work / "heldout_ids.npy", held)
    account = {
        "tokenizer": tok_sha,
        "train_tokens": len(train),
        "heldout_tokens": len(held),
        "sources": {s.name: accounts[s.name] for s in sources},
        "heldout": accounts[heldout.name],
    }
    atomic_write_json(work / "corpus.json", account, sort_keys=False)
    return train, held, account
